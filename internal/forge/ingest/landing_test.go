package ingest

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/tests/pds"
)

// TestLandingsAreTrustedPushes: a landing in the repo of the
// repository's lander is a trusted push of its ref and new commit; a
// landing in another runner's repo, for another repository, or by a
// fallback lander the owner's landers do not name, is not work.
func TestLandingsAreTrustedPushes(t *testing.T) {
	ctx, srv := startPDS(t)
	owner, lander, _, err := srv.OwnerAndRunner(ctx, "landing")
	if err != nil {
		t.Fatal(err)
	}
	other, err := srv.CreateAccount(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	repoURI := forge.RepoURI(owner.DID, "hello")
	if _, err := owner.Put(ctx, forge.CollectionRepo, "hello", forge.Repo{Type: forge.CollectionRepo, Name: "hello", Source: "file:///nowhere",
		Runners: []string{other.DID.String(), lander.DID.String()}, Landers: []string{lander.DID.String()}, CreatedAt: forge.Now()}); err != nil {
		t.Fatal(err)
	}
	// ungranted's lander is the first of its runners by fallback: landers
	// names nobody, so its landing records are nobody's pushes.
	ungrantedURI := forge.RepoURI(owner.DID, "ungranted")
	if _, err := owner.Put(ctx, forge.CollectionRepo, "ungranted", forge.Repo{Type: forge.CollectionRepo, Name: "ungranted", Source: "file:///nowhere",
		Runners: []string{lander.DID.String(), other.DID.String()}, CreatedAt: forge.Now()}); err != nil {
		t.Fatal(err)
	}
	a, b := strings.Repeat("a", 40), strings.Repeat("b", 40)
	landing := func(acct *pds.Account, repo string) syntax.ATURI {
		t.Helper()
		uri, err := acct.Put(ctx, forge.CollectionLanding, syntax.NewTIDNow(0).String(), forge.Landing{Type: forge.CollectionLanding, Repo: repo,
			Ref: "refs/heads/main", Old: a, New: b, Batch: "at://" + acct.DID.String() + "/dev.knotless.batch/x", CreatedAt: forge.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return uri
	}
	good := landing(lander, repoURI.String())
	landing(other, repoURI.String())
	landing(lander, forge.RepoURI(owner.DID, "elsewhere").String())
	landing(lander, ungrantedURI.String())

	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	dir := pdsclient.NewDirectory(pdsclient.DirectoryConfig{PLCURL: srv.PLCURL})
	l := &Lister{
		Reader:  &pdsclient.Reader{Dir: dir, Catalog: cat},
		Dir:     dir,
		Runner:  other.DID,
		Targets: []Target{{Owner: syntax.AtIdentifier(owner.DID), Name: "hello"}, {Owner: syntax.AtIdentifier(owner.DID), Name: "ungranted"}},
		Logger:  slog.New(slog.DiscardHandler),
	}
	snap, err := l.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		Kind, URI, Ref, Commit string
		Trusted                bool
	}
	var got []ev
	for _, e := range snap.Events {
		got = append(got, ev{e.Kind, e.URI.String(), e.Ref, e.Commit, e.Trusted})
	}
	want := []ev{{forge.KindPush, good.String(), "refs/heads/main", b, true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}
