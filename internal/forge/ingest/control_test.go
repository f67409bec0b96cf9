package ingest

import (
	"log/slog"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/tests/forgeworld"
)

// Run-control records are listed from the owners (dispatches for the
// repositories served only) and from the accounts known to write pulls,
// cancels or re-runs: a stranger's cancel once a stream showed it
// writing one. Dispatches of other accounts are never listed.
func TestListsControlRecords(t *testing.T) {
	ctx, srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "controls", Source: "file:///nowhere"})
	stranger, err := srv.CreateAccount(ctx, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	now := forge.Now()
	ownCancel := w.Put(w.Owner, forge.CollectionCancel, "c1", forge.Cancel{Type: forge.CollectionCancel, Check: "k1", CreatedAt: now})
	ownRerun := w.Put(w.Owner, forge.CollectionRerun, "", forge.Rerun{Type: forge.CollectionRerun, Check: "k1", CreatedAt: now})
	served := w.Put(w.Owner, forge.CollectionDispatch, "", forge.Dispatch{Type: forge.CollectionDispatch, Repo: w.RepoURI.String(),
		Ref: "refs/heads/main", Workflow: "deploy", CreatedAt: now})
	w.Put(w.Owner, forge.CollectionDispatch, "", forge.Dispatch{Type: forge.CollectionDispatch, Repo: forge.RepoURI(w.Owner.DID, "other").String(),
		Ref: "refs/heads/main", Workflow: "deploy", CreatedAt: now})
	w.Put(stranger, forge.CollectionDispatch, "", forge.Dispatch{Type: forge.CollectionDispatch, Repo: w.RepoURI.String(),
		Ref: "refs/heads/main", Workflow: "deploy", CreatedAt: now})
	strangers := w.Put(stranger, forge.CollectionCancel, "c2", forge.Cancel{Type: forge.CollectionCancel, Check: "k1", CreatedAt: now})

	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	dir := srv.Directory()
	l := &Lister{Reader: &pdsclient.Reader{Dir: dir, Catalog: cat}, Dir: dir, Runner: w.Runner.DID,
		Targets: []Target{{Owner: syntax.AtIdentifier(w.Owner.DID), Name: forgeworld.RepoName}}, Pulls: true, Logger: slog.New(slog.DiscardHandler)}
	uris := func() map[syntax.ATURI]bool {
		snap, err := l.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[syntax.ATURI]bool{}
		for _, r := range snap.Controls.Cancels {
			got[r.URI] = true
		}
		for _, r := range snap.Controls.Reruns {
			got[r.URI] = true
		}
		for _, r := range snap.Controls.Dispatches {
			got[r.URI] = true
		}
		return got
	}
	got := uris()
	if len(got) != 3 || !got[ownCancel] || !got[ownRerun] || !got[served] {
		t.Errorf("listed %v, want the owner's cancel, rerun and dispatch for the served repository", got)
	}
	l.Changed(Change{Host: srv.URL, DID: stranger.DID, Collection: forge.CollectionCancel})
	if got := uris(); len(got) != 4 || !got[strangers] {
		t.Errorf("listed %v, want the stranger's cancel too once seen writing one", got)
	}
}
