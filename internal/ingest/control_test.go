package ingest

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/pdsclient"
	"knotless.dev/run/tests/forgeworld"
)

// A run-control event's key, check keys, attempts and cache order.
func TestControlEvent(t *testing.T) {
	t.Parallel()
	repo := forge.Record[forge.Repo]{URI: "at://did:plc:o/dev.knotless.repo/r"}
	push := Event{Kind: forge.KindPush, URI: "at://did:plc:o/dev.knotless.refUpdate/3k1", Repo: repo, Ref: "refs/heads/main", Commit: strings.Repeat("a", 40)}
	rerun := push
	rerun.Control = Control{Cause: "at://did:plc:o/dev.knotless.rerun/3r1", Workflows: map[string]int64{"ci": 2, "lint": 1}}
	if rerun.Key() == push.Key() || rerun.Key() != rerun.Cause+"@"+push.Commit {
		t.Errorf("a re-run's key %q (the push's %q)", rerun.Key(), push.Key())
	}
	if got, want := rerun.CheckKey("ci"), forge.AttemptKey(push.Subject(), "ci", 2); got != want {
		t.Errorf("attempt 2's key %s, want %s", got, want)
	}
	if got, want := rerun.CheckKey("lint"), forge.CheckKey(push.Subject(), "lint"); got != want {
		t.Errorf("attempt 1's key %s, want the first's %s", got, want)
	}
	if rerun.Attempt("ci") != 2 || rerun.Attempt("lint") != 0 || push.Attempt("ci") != 0 {
		t.Errorf("attempts %d %d %d", rerun.Attempt("ci"), rerun.Attempt("lint"), push.Attempt("ci"))
	}
	if rerun.Subject() != push.Subject() {
		t.Error("a re-run's subject is not its original's")
	}
	tick := Event{Kind: forge.KindSchedule, URI: repo.URI, Repo: repo, Commit: push.Commit,
		Control: Control{Workflows: map[string]int64{"nightly": 1}, Tick: "2026-12-05T03:00:00Z"}}
	if tick.Subject().Tick != tick.Tick || !strings.Contains(tick.Key(), tick.Tick) {
		t.Errorf("a tick's subject %+v, key %q", tick.Subject(), tick.Key())
	}
	later := tick
	later.Tick = "2026-12-06T03:00:00Z"
	if tick.Order() >= later.Order() || push.Order() != "3k1" {
		t.Errorf("orders: tick %s, later %s, push %s", tick.Order(), later.Order(), push.Order())
	}
	if _, err := syntax.ParseTID(tick.Order()); err != nil {
		t.Errorf("a tick's order %q is not a TID: %v", tick.Order(), err)
	}
}

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
