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
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// countingTransport counts requests by XRPC method and, for a method
// of one collection, that collection ("com.atproto.repo.listRecords
// dev.knotless.refUpdate"), or "plc" for the PLC directory.
type countingTransport struct {
	plc string
	mu  sync.Mutex
	n   map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	key := strings.TrimPrefix(r.URL.Path, "/xrpc/")
	if collection := r.URL.Query().Get("collection"); collection != "" {
		key += " " + collection
	}
	if strings.HasPrefix(r.URL.String(), c.plc) {
		key = "plc"
	}
	c.mu.Lock()
	c.n[key]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// countedReader is a pdsclient.Reader of srv (and its PLC directory) whose
// requests counter counts.
func countedReader(t *testing.T, srv *pds.Server) (*countingTransport, *pdsclient.Reader) {
	t.Helper()
	counter := &countingTransport{plc: srv.PLCURL, n: map[string]int{}}
	return counter, readerVia(t, srv, counter)
}

// readerVia is a pdsclient.Reader of srv (and its PLC directory) whose
// requests go through rt.
func readerVia(tb testing.TB, srv *pds.Server, rt http.RoundTripper) *pdsclient.Reader {
	tb.Helper()
	hc := &http.Client{Transport: rt}
	tb.Cleanup(hc.CloseIdleConnections)
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		tb.Fatal(err)
	}
	dir := pdsclient.NewDirectory(pdsclient.DirectoryConfig{PLCURL: srv.PLCURL, HTTP: hc})
	return &pdsclient.Reader{Dir: dir, Catalog: cat, HTTP: hc}
}

func (c *countingTransport) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// TestPollCostFollowsWatchedRepos: a poll (a reconcile with pulls) asks
// the PDS the same questions however many accounts it hosts that are
// not watched, lists no accounts without discovery, and resolves no DID
// it resolved within the identity TTL. A pull of an account outside the
// watched ones is found once an event stream shows it writing pulls.
func TestPollCostFollowsWatchedRepos(t *testing.T) {
	ctx, srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "poll", Source: "file:///nowhere"})
	owner, runner, repoURI := w.Owner, w.Runner, w.RepoURI
	put := func(a *pds.Account, collection string, v any) syntax.ATURI {
		t.Helper()
		return w.Put(a, collection, "", v)
	}
	w.PushCommit("", strings.Repeat("a", 40))

	counter, reader := countedReader(t, srv)
	l := &Lister{
		Reader:  reader,
		Dir:     reader.Dir,
		Runner:  runner.DID,
		Targets: []Target{{Owner: syntax.AtIdentifier(owner.DID), Name: "hello"}},
		Pulls:   true,
		Logger:  slog.New(slog.DiscardHandler),
	}
	poll := func() (*Snapshot, map[string]int) {
		t.Helper()
		snap, err := l.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return snap, counter.take()
	}
	poll() // resolves the owner once
	_, small := poll()
	if small["plc"] != 0 {
		t.Errorf("a second poll resolved %d DIDs again, want none within the identity TTL", small["plc"])
	}
	if small["com.atproto.sync.listRepos"] != 0 {
		t.Errorf("a poll without discovery listed the PDS's accounts %d times", small["com.atproto.sync.listRepos"])
	}

	// Strangers join the PDS, one of them with a pull on the repository.
	var author *pds.Account
	for i := range 6 {
		a, err := srv.CreateAccount(ctx, "stranger")
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			author = a
		}
	}
	pull := put(author, forge.CollectionPull, forge.Pull{Type: forge.CollectionPull, Repo: repoURI.String(), Base: "main",
		Head:  forge.PullHead{Source: "file:///fork", Ref: "refs/heads/feature", Commit: strings.Repeat("b", 40)},
		Title: "a feature", State: forge.PullOpen, CreatedAt: forge.Now()})
	snap, big := poll()
	if diff := cmp.Diff(small, big); diff != "" {
		t.Errorf("requests of a poll (-with 3 accounts +with 9):\n%s", diff)
	}
	if len(snap.Events) != 1 {
		t.Errorf("events %+v, want the push only (no stream has shown the stranger's pull)", snap.Events)
	}

	l.Changed(Change{Host: srv.URL, DID: author.DID, Collection: forge.CollectionPull})
	snap, _ = poll()
	var got []string
	for _, e := range snap.Events {
		got = append(got, e.Kind+" "+e.URI.String())
	}
	if len(got) != 2 || !slices.Contains(got, forge.KindPull+" "+pull.String()) {
		t.Errorf("events %v, want the push and the pull %s", got, pull)
	}
}

// TestListingsStopAtTheRetention: an owner's long history of pushes,
// reruns and dispatches past the retention (never acted on) costs a
// reconcile no pages: each listing, newest first, stops at the first
// page that reaches one. The same listings without a retention read
// them all. Cancels are read whatever their age.
func TestListingsStopAtTheRetention(t *testing.T) {
	ctx, srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "history", Source: "file:///nowhere"})
	start := time.Now().Add(-60 * 24 * time.Hour)
	oldKey := func(i int) string {
		return syntax.NewTID(start.Add(time.Duration(i)*time.Minute).UnixMicro(), 0).String()
	}
	// Each in two pages of 100 and an empty third.
	const oldPushes, oldControls = 101, 101
	for i := range oldPushes {
		w.Put(w.Owner, forge.CollectionRefUpdate, oldKey(i), forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(),
			Ref: "refs/heads/main", Old: strings.Repeat("0", 40), New: strings.Repeat("c", 40), CreatedAt: forge.Now()})
	}
	for i := range oldControls {
		w.Put(w.Owner, forge.CollectionRerun, oldKey(i), forge.Rerun{Type: forge.CollectionRerun, Check: "old", CreatedAt: forge.Now()})
		w.Put(w.Owner, forge.CollectionDispatch, oldKey(i), forge.Dispatch{Type: forge.CollectionDispatch, Repo: w.RepoURI.String(),
			Ref: "refs/heads/main", Workflow: "ci", CreatedAt: forge.Now()})
		w.Put(w.Owner, forge.CollectionCancel, oldKey(i), forge.Cancel{Type: forge.CollectionCancel, Check: "old", CreatedAt: forge.Now()})
	}
	recent := []syntax.ATURI{w.PushCommit("", strings.Repeat("a", 40)), w.PushCommit(strings.Repeat("a", 40), strings.Repeat("b", 40))}

	counter, reader := countedReader(t, srv)
	for _, tc := range []struct {
		retention time.Duration
		pages     map[string]int
	}{
		{30 * 24 * time.Hour, map[string]int{forge.CollectionRefUpdate: 1, forge.CollectionRerun: 1, forge.CollectionDispatch: 1, forge.CollectionCancel: 3}},
		{0, map[string]int{forge.CollectionRefUpdate: 3, forge.CollectionRerun: 3, forge.CollectionDispatch: 3, forge.CollectionCancel: 3}},
	} {
		l := &Lister{
			Reader:    reader,
			Dir:       reader.Dir,
			Runner:    w.Runner.DID,
			Targets:   []Target{{Owner: syntax.AtIdentifier(w.Owner.DID), Name: forgeworld.RepoName}},
			Retention: tc.retention,
			Logger:    slog.New(slog.DiscardHandler),
		}
		snap, err := l.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := counter.take()
		for collection, want := range tc.pages {
			if n := got["com.atproto.repo.listRecords "+collection]; n != want {
				t.Errorf("retention %s: %d pages of %s read, want %d", tc.retention, n, collection, want)
			}
		}
		var events []syntax.ATURI
		for _, ev := range snap.Events {
			events = append(events, ev.URI)
		}
		for _, u := range recent {
			if !slices.Contains(events, u) {
				t.Errorf("retention %s: the recent push %s is not among the %d events", tc.retention, u, len(events))
			}
		}
	}
}
