package ingest

import (
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// roundsTransport holds every request for hold before sending it and
// keeps when each began and ended, so that the rounds of a reconcile
// (requests that wait for others' answers) can be told apart from the
// requests that go together.
type roundsTransport struct {
	hold  time.Duration
	mu    sync.Mutex
	spans []span
}

type span struct{ start, end time.Time }

func (rt *roundsTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	time.Sleep(rt.hold)
	resp, err := http.DefaultTransport.RoundTrip(r)
	rt.mu.Lock()
	rt.spans = append(rt.spans, span{start, time.Now()})
	rt.mu.Unlock()
	return resp, err
}

// heldReader is a pdsclient.Reader of srv (and its PLC directory) whose
// requests are each held hold.
func heldReader(tb testing.TB, srv *pds.Server, hold time.Duration) (*roundsTransport, *pdsclient.Reader) {
	rt := &roundsTransport{hold: hold}
	return rt, readerVia(tb, srv, rt)
}

// rounds is the longest chain of requests each begun after the one
// before it ended, since the last call; and the requests.
func (rt *roundsTransport) rounds() (rounds, requests int) {
	rt.mu.Lock()
	spans := rt.spans
	rt.spans = nil
	rt.mu.Unlock()
	slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
	depth := make([]int, len(spans))
	for i, s := range spans {
		depth[i] = 1
		for j := range i {
			if !spans[j].end.After(s.start) {
				depth[i] = max(depth[i], depth[j]+1)
			}
		}
		rounds = max(rounds, depth[i])
	}
	return rounds, len(spans)
}

// TestReconcileRounds: a reconcile of repositories named by DID asks
// everything at once (the repository records, the owner's pushes and
// pulls, the run-control records of the owner and of the accounts seen
// writing them): two rounds, the second the last page of each listing
// that had records (the PDS gives a cursor with every page that has
// any), where it took five (the records, then the owner's listings and
// their last pages, then the run-control listings and theirs). What a
// read tells (discovered repositories and owners, the authors of the
// pulls found) still waits for that read. The records listed are the
// same either way: the push, and the cancel of an account that acts.
func TestReconcileRounds(t *testing.T) {
	ctx, srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "rounds", Source: "file:///nowhere"})
	push := w.PushCommit("", strings.Repeat("a", 40))
	now := forge.Now()
	// A stranger's pull on the repository, and its cancel (of nothing
	// this runner knows: it is listed, not acted on, here).
	stranger, err := srv.CreateAccount(ctx, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	w.Put(stranger, forge.CollectionPull, "", forge.Pull{Type: forge.CollectionPull, Repo: w.RepoURI.String(), Base: "main",
		Head:  forge.PullHead{Source: "file:///fork", Ref: "refs/heads/feature", Commit: strings.Repeat("b", 40)},
		Title: "a feature", State: forge.PullOpen, CreatedAt: now})
	cancel := w.Put(stranger, forge.CollectionCancel, "c1", forge.Cancel{Type: forge.CollectionCancel, Check: "k1", CreatedAt: now})

	for _, tc := range []struct {
		name   string
		set    func(l *Lister)
		rounds int // 0: not counted
	}{
		{"named by DID, the stranger seen writing", func(l *Lister) {
			l.Targets = []Target{{Owner: syntax.AtIdentifier(w.Owner.DID), Name: forgeworld.RepoName}}
			l.Changed(Change{Host: srv.URL, DID: stranger.DID, Collection: forge.CollectionPull})
		}, 2},
		// The stranger's cancel is listed once its pull, found on the
		// host, shows it: a round after the others.
		{"discovered, pulls on the host", func(l *Lister) {
			l.Discover, l.DiscoverHosts = true, []string{srv.URL}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hold time.Duration
			if tc.rounds != 0 {
				// Far longer than the requests of one round take to be
				// sent one after another, on a loaded machine too.
				hold = 500 * time.Millisecond
			}
			rt, reader := heldReader(t, srv, hold)
			l := &Lister{Reader: reader, Dir: reader.Dir, Runner: w.Runner.DID, Pulls: true, Logger: slog.New(slog.DiscardHandler)}
			tc.set(l)
			// The first reconcile resolves the DIDs (kept for the identity
			// TTL) and finds the owner's PDS answering.
			if _, err := l.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			rt.rounds()
			snap, err := l.Reconcile(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rounds, requests := rt.rounds()
			t.Logf("%d requests in %d rounds", requests, rounds)
			if tc.rounds != 0 && rounds != tc.rounds {
				t.Errorf("a reconcile made its %d requests in %d rounds, want %d", requests, rounds, tc.rounds)
			}
			if !slices.ContainsFunc(snap.Events, func(e work.Event) bool { return e.URI == push }) {
				t.Errorf("events %+v, want the push %s", snap.Events, push)
			}
			if !slices.ContainsFunc(snap.Controls.Cancels, func(r forge.Record[forge.Cancel]) bool { return r.URI == cancel }) {
				t.Errorf("cancels %+v, want the stranger's %s", snap.Controls.Cancels, cancel)
			}
		})
	}
}

// BenchmarkReconcileFarPDS: a reconcile of one repository named by DID,
// with pulls and one author seen writing, against a PDS 50 ms away
// (each request held 50 ms before it goes to the local PDS): the time
// is the rounds' (TestReconcileRounds), as for a runner whose owners'
// PDSes are hosted far from it.
func BenchmarkReconcileFarPDS(b *testing.B) {
	ctx, srv := startPDS(b)
	w := forgeworld.New(b, srv, forgeworld.Options{App: "far", Source: "file:///nowhere"})
	w.PushCommit("", strings.Repeat("a", 40))
	author, err := srv.CreateAccount(ctx, "author")
	if err != nil {
		b.Fatal(err)
	}
	rt, reader := heldReader(b, srv, 50*time.Millisecond)
	l := &Lister{Reader: reader, Dir: reader.Dir, Runner: w.Runner.DID, Pulls: true, Logger: slog.New(slog.DiscardHandler),
		Targets: []Target{{Owner: syntax.AtIdentifier(w.Owner.DID), Name: forgeworld.RepoName}}}
	l.Changed(Change{Host: srv.URL, DID: author.DID, Collection: forge.CollectionPull})
	if _, err := l.Reconcile(ctx); err != nil { // resolves the DIDs
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := l.Reconcile(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_, requests := rt.rounds()
	b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
}

// TestReconcileListsAHostOnce: with --discover and --pulls, a named
// owner's host has its accounts' pulls listed in the first round; a
// discovered owner on the same host, listed in the next, takes those
// pulls, and the host's accounts are not listed again.
func TestReconcileListsAHostOnce(t *testing.T) {
	ctx, srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "hostonce", Source: "file:///nowhere"})
	other, err := srv.CreateAccount(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	w.Put(other, forge.CollectionRepo, "theirs", forge.Repo{Type: forge.CollectionRepo, Name: "theirs", Source: "file:///nowhere",
		Runners: []string{w.Runner.DID.String()}, CreatedAt: forge.Now()})
	pull := w.Put(other, forge.CollectionPull, "", forge.Pull{Type: forge.CollectionPull, Repo: forge.RepoURI(other.DID, "theirs").String(), Base: "main",
		Head:  forge.PullHead{Source: "file:///fork", Ref: "refs/heads/feature", Commit: strings.Repeat("b", 40)},
		Title: "a feature", State: forge.PullOpen, CreatedAt: forge.Now()})

	const listRepos = "com.atproto.sync.listRepos"
	counter, reader := countedReader(t, srv)
	reconcile := func(pulls bool) (*Snapshot, int) {
		t.Helper()
		l := &Lister{Reader: reader, Dir: reader.Dir, Runner: w.Runner.DID, Discover: true, DiscoverHosts: []string{srv.URL}, Pulls: pulls,
			Targets: []Target{{Owner: syntax.AtIdentifier(w.Owner.DID), Name: forgeworld.RepoName}}, Logger: slog.New(slog.DiscardHandler)}
		counter.take()
		snap, err := l.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return snap, counter.take()[listRepos]
	}
	_, discovery := reconcile(false) // the host's accounts listed once, for discovery
	snap, withPulls := reconcile(true)
	if want := 2 * discovery; withPulls != want {
		t.Errorf("%s asked %d times with pulls, want %d (discovery, then the pulls of the host's accounts once)", listRepos, withPulls, want)
	}
	if !slices.ContainsFunc(snap.Events, func(e work.Event) bool { return e.URI == pull }) {
		t.Errorf("events %+v, want the pull %s on the discovered owner's repository", snap.Events, pull)
	}
}
