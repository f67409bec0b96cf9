// Package forgeworld is the forge world the runner's integration tests
// start from: on a test PDS (tests/pds), an owner and a runner account,
// the owner's repository record naming the runner, with a real git
// repository (tests/gitrepo) as its source, and the owner's pushes (a
// commit and its refUpdate record). The daemon, serve, ingest and
// appliance tests build on it; what they do with it is theirs.
package forgeworld

import (
	"context"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/tests/gitrepo"
	"knotless.dev/run/tests/pds"
)

// RepoName is the repository's record key and name.
const RepoName = "hello"

// Options shape a World; the zero value is the common one.
type Options struct {
	// App names the runner's app password (default "knotless-run").
	App string
	// Source is the repository record's source (default file:// of the
	// git repository): a path as the runner sees it, or one that does
	// not exist.
	Source string
}

// World is one owner with one repository and one runner.
type World struct {
	T      testing.TB
	Server *pds.Server
	Owner  *pds.Account
	Runner *pds.Account
	// Password is the runner's app password.
	Password string
	RepoURI  syntax.ATURI
	// Src is the git repository the record's source is.
	Src *gitrepo.Repo
	// Reader reads the accounts' public records on the PDS.
	Reader *pdsclient.Reader
}

// New makes the accounts, the git repository and the repository record.
func New(t testing.TB, srv *pds.Server, o Options) *World {
	t.Helper()
	if o.App == "" {
		o.App = "knotless-run"
	}
	ctx := context.Background()
	owner, runner, password, err := srv.OwnerAndRunner(ctx, o.App)
	if err != nil {
		t.Fatal(err)
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	w := &World{T: t, Server: srv, Owner: owner, Runner: runner, Password: password, Src: gitrepo.New(t),
		RepoURI: forge.RepoURI(owner.DID, RepoName), Reader: &pdsclient.Reader{Dir: srv.Directory(), Catalog: cat}}
	if o.Source == "" {
		o.Source = "file://" + w.Src.Dir
	}
	w.Put(owner, forge.CollectionRepo, RepoName, forge.Repo{
		Type: forge.CollectionRepo, Name: RepoName, Source: o.Source, DefaultBranch: "main",
		Runners: []string{runner.DID.String()}, CreatedAt: forge.Now(),
	})
	return w
}

// Push commits files on main and writes the refUpdate; it returns the
// record's AT-URI and the commit.
func (w *World) Push(files map[string]string) (syntax.ATURI, string) {
	w.T.Helper()
	old := w.Src.Head("refs/heads/main")
	commit := w.Src.Commit("main", files)
	return w.PushCommit(old, commit), commit
}

// PushCommit writes the refUpdate of main from old to commit, which
// need not be in the source.
func (w *World) PushCommit(old, commit string) syntax.ATURI {
	w.T.Helper()
	return w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{
		Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(), Ref: "refs/heads/main", Old: old, New: commit, CreatedAt: forge.Now(),
	})
}

// Put writes a record of a (rkey "" makes a TID); a failure fails the
// test.
func (w *World) Put(a *pds.Account, collection, rkey string, v any) syntax.ATURI {
	w.T.Helper()
	uri, err := a.Put(context.Background(), collection, rkey, v)
	if err != nil {
		w.T.Fatal(err)
	}
	return uri
}

// Checks lists the runner's check records; one that does not match its
// lexicon fails the test.
func (w *World) Checks() []forge.Record[forge.Check] {
	w.T.Helper()
	recs, bad, err := pdsclient.List[forge.Check](context.Background(), w.Reader, w.Runner.DID, forge.CollectionCheck)
	if err != nil {
		w.T.Fatal(err)
	}
	if len(bad) > 0 {
		w.T.Fatalf("invalid check records: %v", bad)
	}
	return recs
}

// Blob downloads a blob of the runner.
func (w *World) Blob(cid string) []byte {
	w.T.Helper()
	b, err := w.Reader.GetBlob(context.Background(), w.Runner.DID, cid)
	if err != nil {
		w.T.Fatal(err)
	}
	return b
}
