package checks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
)

// gatedPDS is a Writer and Batcher that records each call and holds
// the first Put until gate is closed, so that writes queue behind it.
type gatedPDS struct {
	gate     chan struct{}
	batchErr error

	mu    sync.Mutex
	calls []string
	first bool
}

func (p *gatedPDS) Put(_ context.Context, _, rkey string, _ any) (syntax.ATURI, error) {
	p.mu.Lock()
	first := !p.first
	p.first = true
	p.calls = append(p.calls, "put "+rkey)
	p.mu.Unlock()
	if first {
		<-p.gate
	}
	return "", nil
}

func (p *gatedPDS) PutBatch(_ context.Context, writes []pdsclient.Write) error {
	var keys []string
	for _, w := range writes {
		keys = append(keys, fmt.Sprintf("%s(new=%v)", w.Rkey, w.New))
	}
	slices.Sort(keys)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, fmt.Sprintf("batch %v", keys))
	return p.batchErr
}

func (p *gatedPDS) called() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// queued waits until n writes wait in g's queue.
func queued(t *testing.T, g *groupCommit, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		l := len(g.queue)
		g.mu.Unlock()
		if l == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued, want %d", l, n)
		}
	}
}

// burst writes key a, which the PDS holds, then b, c and d beside it,
// and returns their errors once all have returned.
func burst(t *testing.T, p *gatedPDS, g *groupCommit) map[string]error {
	t.Helper()
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	write := func(key string, isNew bool) {
		defer wg.Done()
		_, err := g.put(context.Background(), pdsclient.Write{Collection: forge.CollectionCheck, Rkey: key, Value: check(Running), New: isNew})
		mu.Lock()
		errs[key] = err
		mu.Unlock()
	}
	wg.Add(1)
	go write("a", true)
	for !slices.Contains(p.called(), "put a") {
		time.Sleep(time.Millisecond)
	}
	for i, key := range []string{"b", "c", "d"} {
		wg.Add(1)
		go write(key, i != 1)
		queued(t, g, i+1)
	}
	close(p.gate)
	wg.Wait()
	return errs
}

func TestGroupCommitBatchesTheWritesThatWait(t *testing.T) {
	t.Parallel()
	p := &gatedPDS{gate: make(chan struct{})}
	g := newGroupCommit(p)
	for key, err := range burst(t, p, g) {
		if err != nil {
			t.Errorf("write %s: %v", key, err)
		}
	}
	want := []string{"put a", "batch [b(new=true) c(new=false) d(new=true)]"}
	if got := p.called(); !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q: the write in flight alone, the three that waited for it in one commit", got, want)
	}
	// Nothing in flight: the next write goes at once, alone.
	if _, err := g.put(context.Background(), pdsclient.Write{Rkey: "e"}); err != nil {
		t.Fatal(err)
	}
	if got := p.called(); got[len(got)-1] != "put e" {
		t.Errorf("a write with none in flight: %q, want it put alone", got)
	}
}

func TestGroupCommitFailedBatchWritesEachAlone(t *testing.T) {
	t.Parallel()
	p := &gatedPDS{gate: make(chan struct{}), batchErr: errors.New("InvalidRequest: Could not find a record with key")}
	g := newGroupCommit(p)
	for key, err := range burst(t, p, g) {
		if err != nil {
			t.Errorf("write %s: %v, want it made alone after the batch failed", key, err)
		}
	}
	got := p.called()
	if len(got) != 5 || got[0] != "put a" || got[1] != "batch [b(new=true) c(new=false) d(new=true)]" {
		t.Fatalf("calls %q", got)
	}
	alone := slices.Sorted(slices.Values(got[2:]))
	if want := []string{"put b", "put c", "put d"}; !slices.Equal(alone, want) {
		t.Errorf("after the failed batch: %q, want each of its writes alone %q", alone, want)
	}
}

// onlyPut writes one record at a time; a Batcher in front of it says so.
type onlyPut struct{ *gatedPDS }

func (o onlyPut) PutBatch(context.Context, []pdsclient.Write) error {
	return fmt.Errorf("one at a time: %w", errors.ErrUnsupported)
}

func TestGroupCommitStopsBatchingWhenTheWriterCannot(t *testing.T) {
	t.Parallel()
	p := &gatedPDS{gate: make(chan struct{})}
	g := newGroupCommit(onlyPut{p})
	for key, err := range burst(t, p, g) {
		if err != nil {
			t.Errorf("write %s: %v", key, err)
		}
	}
	if g.b != nil {
		t.Error("still batching after the writer said it cannot")
	}
	if got := p.called(); len(got) != 4 || slices.ContainsFunc(got, func(s string) bool { return s[:4] != "put " }) {
		t.Errorf("calls %q, want four puts", got)
	}
}

func TestGroupCommitQueuedWriteLeavesWithItsContext(t *testing.T) {
	t.Parallel()
	p := &gatedPDS{gate: make(chan struct{})}
	g := newGroupCommit(p)
	start := func(ctx context.Context, key string) <-chan error {
		done := make(chan error, 1)
		go func() { _, err := g.put(ctx, pdsclient.Write{Rkey: key, New: true}); done <- err }()
		return done
	}
	a := start(context.Background(), "a")
	for !slices.Contains(p.called(), "put a") {
		time.Sleep(time.Millisecond)
	}
	b := start(context.Background(), "b")
	queued(t, g, 1)
	ctx, cancel := context.WithCancel(context.Background())
	c := start(ctx, "c")
	queued(t, g, 2)
	d := start(context.Background(), "d")
	queued(t, g, 3)
	cancel()
	if err := <-c; !errors.Is(err, context.Canceled) {
		t.Errorf("the queued write whose context ended returned %v, want context.Canceled", err)
	}
	queued(t, g, 2)
	close(p.gate)
	for key, done := range map[string]<-chan error{"a": a, "b": b, "d": d} {
		if err := <-done; err != nil {
			t.Errorf("write %s: %v", key, err)
		}
	}
	want := []string{"put a", "batch [b(new=true) d(new=true)]"}
	if got := p.called(); !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q: the write whose caller left before its batch went is not made", got, want)
	}
}

// openPDS is a gatedPDS that holds no write.
func openPDS() *gatedPDS {
	p := &gatedPDS{gate: make(chan struct{})}
	close(p.gate)
	return p
}

func TestGroupCommitWaitsForExpectedWrites(t *testing.T) {
	t.Parallel()
	p := openPDS()
	g := newGroupCommit(p)
	g.linger = time.Hour // only the expected writes end the wait
	// A burst: a lane expects its first write (by its context), a worker
	// the running check of its key, and a write comes first.
	lane, laneDone := g.expect(context.Background(), "")
	defer laneDone()
	_, workerDone := g.expect(context.Background(), "b")
	defer workerDone()
	put := func(ctx context.Context, key string) <-chan error {
		done := make(chan error, 1)
		go func() { _, err := g.put(ctx, pdsclient.Write{Rkey: key, New: true}); done <- err }()
		return done
	}
	a := put(context.Background(), "a")
	queued(t, g, 1)
	c := put(lane, "c")
	queued(t, g, 2)
	if got := p.called(); len(got) != 0 {
		t.Fatalf("calls %q while a write is expected, want none", got)
	}
	b := put(context.Background(), "b")
	for key, done := range map[string]<-chan error{"a": a, "b": b, "c": c} {
		if err := <-done; err != nil {
			t.Errorf("write %s: %v", key, err)
		}
	}
	want := []string{"batch [a(new=true) b(new=true) c(new=true)]"}
	if got := p.called(); !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q: the writes that came while others were expected in one commit", got, want)
	}
	// Nothing expected any more: the next write goes at once, alone.
	if err := <-put(lane, "d"); err != nil {
		t.Fatal(err)
	}
	if got := p.called(); got[len(got)-1] != "put d" {
		t.Errorf("a write with nothing expected: %q, want it put alone", got)
	}
}

func TestGroupCommitExpectationEndsWithoutItsWrite(t *testing.T) {
	t.Parallel()
	p := openPDS()
	g := newGroupCommit(p)
	g.linger = time.Hour
	_, done := g.expect(context.Background(), "b")
	a := make(chan error, 1)
	go func() { _, err := g.put(context.Background(), pdsclient.Write{Rkey: "a"}); a <- err }()
	queued(t, g, 1)
	done()
	done() // twice is once
	if err := <-a; err != nil {
		t.Fatal(err)
	}
	if got, want := p.called(), []string{"put a"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
}

func TestGroupCommitLingersNoLongerThanItsBound(t *testing.T) {
	t.Parallel()
	p := openPDS()
	g := newGroupCommit(p)
	g.linger = 20 * time.Millisecond
	_, never := g.expect(context.Background(), "never")
	defer never()
	// The expected write does not come: the queue goes after the linger,
	// and the expectation holds no later write.
	for _, key := range []string{"a", "b"} {
		if _, err := g.put(context.Background(), pdsclient.Write{Rkey: key}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := p.called(), []string{"put a", "put b"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.expected) != 0 || g.lingering != nil {
		t.Errorf("after the linger: %d writes still expected, timer armed %v", len(g.expected), g.lingering != nil)
	}
}
