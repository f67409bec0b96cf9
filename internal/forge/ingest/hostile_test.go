package ingest

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/hostilepds"
)

// TestPoolBoundsParallelismAndTime: a reconcile's listings run at most
// Parallel at once, every one of them, each under its own deadline; once
// the reconcile's context ends, no more are started.
func TestPoolBoundsParallelismAndTime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := Bounds{Parallel: 3, Deadline: time.Minute}.pool()
		var now, most atomic.Int64
		var ran [10]bool
		var ended [10]error
		p.each(t.Context(), 10, func(ctx context.Context, i int) {
			n := now.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			ran[i] = true
			<-ctx.Done() // a PDS that never answers
			ended[i] = ctx.Err()
			now.Add(-1)
		})
		if most.Load() != 3 {
			t.Errorf("at most %d listings at once, want 3", most.Load())
		}
		for i := range ran {
			if !ran[i] || ended[i] != context.DeadlineExceeded {
				t.Errorf("listing %d: ran %v, ended by %v; want every listing run and ended by its deadline", i, ran[i], ended[i])
			}
		}

		ctx, cancel := context.WithCancel(t.Context())
		started := 0
		var mu sync.Mutex
		p.each(ctx, 10, func(ctx context.Context, i int) {
			mu.Lock()
			started++
			if started == 3 {
				cancel() // the daemon stops
			}
			mu.Unlock()
			<-ctx.Done()
		})
		if started != 3 {
			t.Errorf("%d listings started, want none after the context ended", started)
		}
	})
}

// signalTransport closes listed when a listing of the pushes of did
// goes out.
type signalTransport struct {
	did    string
	once   sync.Once
	listed chan struct{}
}

func (s *signalTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	q := r.URL.Query()
	if strings.HasSuffix(r.URL.Path, "/com.atproto.repo.listRecords") && q.Get("repo") == s.did && q.Get("collection") == forge.CollectionRefUpdate {
		s.once.Do(func() { close(s.listed) })
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestHostilePDSHoldsNoListing: an owner whose PDS pages forever, or
// never answers, is listed first; the repository of an owner on a real
// PDS is still in the first reconcile's snapshot. The endless listing
// stops at its page bound (logged, naming the host, the account and
// the bound) and what it read is used; the silent one ends at the
// deadline, is logged and backed off, and is held while the real
// owner is listed beside it.
func TestHostilePDSHoldsNoListing(t *testing.T) {
	ctx, srv := startPDS(t)
	w := forgeworld.New(t, srv, forgeworld.Options{App: "hostile", Source: "file:///nowhere"})
	push := w.PushCommit("", strings.Repeat("a", 40))
	hostile, err := srv.CreateAccount(ctx, "hostile")
	if err != nil {
		t.Fatal(err)
	}
	evil := w.Put(hostile, forge.CollectionRepo, "evil", forge.Repo{Type: forge.CollectionRepo, Name: "evil", Source: "file:///nowhere",
		DefaultBranch: "main", Runners: []string{w.Runner.DID.String()}, CreatedAt: forge.Now()})
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}

	lister := func(t *testing.T, h *hostilepds.Server, hc *http.Client, log *syncbuf.Buffer) *Lister {
		dir := hostilepds.Directory(pdsclient.NewDirectory(pdsclient.DirectoryConfig{PLCURL: srv.PLCURL}), map[syntax.DID]string{hostile.DID: h.URL})
		return &Lister{
			Reader: &pdsclient.Reader{Dir: dir, Catalog: cat, HTTP: hc},
			Dir:    dir,
			Runner: w.Runner.DID,
			// The hostile owner first: listed one after the other, it
			// would come before the real one.
			Targets: []Target{{Owner: syntax.AtIdentifier(hostile.DID), Name: "evil"}, {Owner: syntax.AtIdentifier(w.Owner.DID), Name: forgeworld.RepoName}},
			Bounds:  Bounds{Deadline: 3 * time.Second},
			Logger:  slog.New(slog.NewTextHandler(log, nil)),
		}
	}
	events := func(snap *Snapshot) (repos, evs []string) {
		for _, r := range snap.Repos {
			repos = append(repos, r.URI.String())
		}
		for _, e := range snap.Events {
			evs = append(evs, e.URI.String())
		}
		return repos, evs
	}

	t.Run("pages forever", func(t *testing.T) {
		h := hostilepds.Start(t, srv.URL, hostilepds.Options{Mode: hostilepds.Endless})
		log := &syncbuf.Buffer{}
		snap, err := lister(t, h, &http.Client{}, log).Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		repos, evs := events(snap)
		if len(evs) != 1 || evs[0] != push.String() {
			t.Errorf("events %v, want the real owner's push %s", evs, push)
		}
		if len(repos) != 2 || repos[0] != evil.String() {
			t.Errorf("repositories %v, want both: the hostile owner's listing is used up to its bound", repos)
		}
		if !snap.Complete {
			t.Error("a listing used up to its bound makes the snapshot incomplete")
		}
		// Its pushes, and its cancel, rerun and dispatch records: each
		// listing to the bound.
		if got := h.Listed(); got != 4*pdsclient.DefaultListPages {
			t.Errorf("the hostile PDS was asked for %d pages, want four listings to the bound of %d", got, pdsclient.DefaultListPages)
		}
		for _, want := range []string{"listing stopped at its bound", "host=" + h.URL, hostile.DID.String(), "bound=pages", "limit=100"} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("the log does not say %q:\n%s", want, log)
			}
		}
	})

	t.Run("never answers", func(t *testing.T) {
		signal := &signalTransport{did: w.Owner.DID.String(), listed: make(chan struct{})}
		var sawOther atomic.Bool
		h := hostilepds.Start(t, srv.URL, hostilepds.Options{Mode: hostilepds.Hang, Held: func(ctx context.Context) {
			select {
			case <-signal.listed:
				sawOther.Store(true)
			case <-ctx.Done():
			}
		}})
		log := &syncbuf.Buffer{}
		l := lister(t, h, &http.Client{Transport: signal}, log)
		snap, err := l.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		repos, evs := events(snap)
		if len(evs) != 1 || evs[0] != push.String() || len(repos) != 1 {
			t.Errorf("repositories %v, events %v; want the real owner's repository and push only", repos, evs)
		}
		if snap.Complete {
			t.Error("the snapshot is complete without the hostile owner's repository: what is kept of it would be forgotten")
		}
		if !sawOther.Load() {
			t.Error("the real owner was not listed while the hostile PDS held its listing")
		}
		for _, want := range []string{"owner's PDS failed", "host=" + h.URL, "past the listing deadline of 3s"} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("the log does not say %q:\n%s", want, log)
			}
		}
		asked := h.Listed()
		snap, err = l.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, evs := events(snap); len(evs) != 1 {
			t.Errorf("second reconcile: events %v, want the real owner's push", evs)
		}
		if snap.Complete {
			t.Error("second reconcile: complete while the hostile PDS backs off")
		}
		if h.Listed() != asked {
			t.Errorf("the hostile PDS was asked again (%d, then %d) while it backs off", asked, h.Listed())
		}
	})
}
