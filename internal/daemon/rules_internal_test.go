package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/checks"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/state"
)

// The daemon's rules with an in-memory PDS: check writes, supersede,
// owed checks, fetch retries and state.json. The real-PDS tests cover
// the same ground end to end.

// fakePDS takes check records, or fails them as scripted.
type fakePDS struct {
	mu      sync.Mutex
	fail    []error // the next writes' errors, in order
	written []string
}

func (f *fakePDS) Put(_ context.Context, _, rkey string, v any) (syntax.ATURI, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.fail) > 0 {
		err := f.fail[0]
		f.fail = f.fail[1:]
		if err != nil {
			return "", err
		}
	}
	f.written = append(f.written, rkey+" "+v.(forge.Check).Status)
	return "", nil
}

func (f *fakePDS) writes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.written...)
}

var errDown = errors.New("connection refused")

func testDaemon(t *testing.T) (*Daemon, *fakePDS) {
	t.Helper()
	cfg := Config{StateDir: t.TempDir(), CacheDir: t.TempDir()}
	cfg.defaults()
	d := &Daemon{cfg: cfg, log: slog.New(slog.DiscardHandler), wake: make(chan struct{}, 1), q: newQueue(), st: state.New()}
	d.cfg.HTTP = d.faults.init(d.cfg.HTTP)
	d.sf.dir = cfg.StateDir
	d.st.Done = map[string]time.Time{}
	pds := &fakePDS{}
	d.rec = checks.NewRecorder(pds, nil)
	return d, pds
}

func saved(t *testing.T, d *Daemon) *state.State {
	t.Helper()
	st, err := state.Load(d.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestEnqueueSupersedesWaitingWithFakes(t *testing.T) {
	t.Parallel()
	d, pds := testDaemon(t)
	ctx := t.Context()
	old, newer := pushJob("3k1", "main", "ci"), pushJob("3k2", "main", "ci")
	for _, j := range []*job{old, newer} {
		if err := d.enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"k-3k1-ci queued", "k-3k2-ci queued", "k-3k1-ci cancelled"}
	if diff := cmp.Diff(want, pds.writes()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	if c, _ := d.rec.Get(old.key); c.Error != "superseded by "+string(newer.ev.URI) {
		t.Errorf("superseded check's error = %q", c.Error)
	}
	if _, done := saved(t, d).Done[old.ev.Key()]; !done {
		t.Error("the superseded event is not done in state.json")
	}
	// Queued again (a reconcile while it waits): no second write.
	d.q.waiting = nil
	if err := d.enqueue(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if got := len(pds.writes()); got != 3 {
		t.Errorf("%d writes after queueing a queued check again, want 3", got)
	}
}

func TestEnqueueCancelsRunningWithFakes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, _ := testDaemon(t)
		ctx := t.Context()
		old := pushJob("3k1", "main", "ci")
		if err := d.enqueue(ctx, old); err != nil {
			t.Fatal(err)
		}
		j, jctx := d.next(ctx, context.Background())
		if j != old {
			t.Fatalf("claimed %v", j)
		}
		if err := d.enqueue(ctx, pushJob("3k2", "main", "ci")); err != nil {
			t.Fatal(err)
		}
		<-jctx.Done() // the older run is cancelled
		if old.superseded == "" {
			t.Error("the older run is not marked superseded")
		}
		d.jobEnded(old)
		if d.q.inHand(old.ev.Key()) {
			t.Error("ended job still in hand")
		}
	})
}

func TestEnqueueFailsWhenTheQueuedCheckIsNotWritten(t *testing.T) {
	t.Parallel()
	d, pds := testDaemon(t)
	pds.fail = []error{errDown}
	if err := d.enqueue(t.Context(), pushJob("3k1", "main", "ci")); err == nil {
		t.Fatal("enqueue without its queued check succeeded")
	}
	if len(d.q.waiting) != 0 {
		t.Error("a job whose queued check was not written is queued")
	}
}

// TestOwedCheckPaidLater: a final check the PDS does not take is kept
// in state.json and written when the PDS answers again; the work is
// done, never run again.
func TestOwedCheckPaidLater(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, pds := testDaemon(t)
		ctx := t.Context()
		ev := pushEvent("did:plc:owner", "3k1")
		pds.fail = []error{errDown, errDown}
		d.finalError(ctx, ev, "ci", "no")
		key := forge.CheckKey(ev.Subject(), "ci")
		if _, owed := saved(t, d).Owed[key]; !owed {
			t.Fatal("the check is not owed in state.json")
		}
		if c, ok := d.rec.Get(key); !ok || !c.Final() {
			t.Error("the owed check is not known final")
		}
		if wait := d.payDue(ctx); wait <= 0 {
			t.Errorf("payDue before the backoff: wait %s", wait)
		}
		time.Sleep(d.cfg.Retry.Backoff)
		if wait := d.payDue(ctx); wait <= 0 { // fails again: backs off
			t.Errorf("wait %s", wait)
		}
		if o := saved(t, d).Owed[key]; o.Tries != 2 {
			t.Errorf("tries = %d, want 2", o.Tries)
		}
		time.Sleep(time.Minute)
		d.payDue(ctx)
		st := saved(t, d)
		if _, owed := st.Owed[key]; owed {
			t.Error("still owed after the PDS took it")
		}
		if _, done := st.Done[ev.Key()]; !done {
			t.Error("the event is not done once its check is written")
		}
		if diff := cmp.Diff([]string{key + " error"}, pds.writes()); diff != "" {
			t.Errorf("writes (-want +got):\n%s", diff)
		}
	})
}

func TestLoadOwedKnowsThemFinal(t *testing.T) {
	t.Parallel()
	d, _ := testDaemon(t)
	d.st.Owed = map[string]state.Owed{
		"good": {Check: []byte(`{"status":"success","workflow":"ci"}`), Event: "e@c"},
		"bad":  {Check: []byte(`{`)},
	}
	d.loadOwed()
	if c, ok := d.rec.Get("good"); !ok || !c.Final() {
		t.Error("owed check not known final")
	}
	if _, ok := d.st.Owed["bad"]; ok {
		t.Error("an unreadable owed check is kept")
	}
}

func TestRefusedTwiceIsFinalAllTheSame(t *testing.T) {
	t.Parallel()
	d, pds := testDaemon(t)
	invalid := &atclient.APIError{StatusCode: http.StatusBadRequest, Name: "InvalidRecord"}
	pds.fail = []error{invalid, invalid}
	ev := pushEvent("did:plc:owner", "3k1")
	d.finalError(t.Context(), ev, "ci", "no")
	key := forge.CheckKey(ev.Subject(), "ci")
	if c, ok := d.rec.Get(key); !ok || c.Status != string(checks.Error) {
		t.Errorf("known %+v, want a final error check", c)
	}
	if len(d.st.Owed) != 0 {
		t.Error("a refused check is owed: it would be tried forever")
	}
	// Final already: a second error of the same work writes nothing.
	d.finalError(t.Context(), ev, "ci", "again")
	if len(pds.writes()) != 0 {
		t.Errorf("writes %v, want none", pds.writes())
	}
}

func TestFetchTriesThenErrorCheck(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, pds := testDaemon(t)
		d.cfg.Retry.FetchTries = 2
		ctx := t.Context()
		ev := pushEvent("did:plc:owner", "3k1")
		if !d.fetchDue(ev) {
			t.Fatal("a new event is not due")
		}
		if err := d.fetchFailed(ctx, ev, "https://src", errDown); err == nil {
			t.Fatal("first failed fetch gave no error to retry")
		}
		if d.fetchDue(ev) {
			t.Error("due again before its backoff")
		}
		time.Sleep(d.cfg.Retry.FetchBackoff)
		if !d.fetchDue(ev) {
			t.Error("not due after its backoff")
		}
		if err := d.fetchFailed(ctx, ev, "https://src", errDown); err != nil {
			t.Fatalf("last try: %v", err)
		}
		key := forge.CheckKey(ev.Subject(), SourceCheck)
		if diff := cmp.Diff([]string{key + " error"}, pds.writes()); diff != "" {
			t.Errorf("writes (-want +got):\n%s", diff)
		}
		if _, done := saved(t, d).Done[ev.Key()]; !done {
			t.Error("event not done after its error check")
		}
	})
}

func TestStateFileMovesForward(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f := stateFile{dir: dir}
	st := state.New()
	st.Done = map[string]time.Time{"a": time.Unix(1, 0).UTC()}
	older := f.snapshot(st)
	st.Done["b"] = time.Unix(2, 0).UTC()
	newer := f.snapshot(st)
	if err := f.write(newer); err != nil {
		t.Fatal(err)
	}
	if err := f.write(older); err != nil {
		t.Fatal(err)
	}
	got, err := state.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Done) != 2 {
		t.Errorf("state.json went back to an older snapshot: %v", got.Done)
	}
}

// TestStateWriteOutsideTheLock: a state write in progress does not hold
// the daemon's mutex (a slow disk must not stall the workers).
func TestStateWriteOutsideTheLock(t *testing.T) {
	t.Parallel()
	d, _ := testDaemon(t)
	d.sf.mu.Lock() // a write that does not end
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.markDone(pushEvent("did:plc:owner", "3k1"))
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.mu.Lock()
		_, marked := d.st.Done[pushEvent("did:plc:owner", "3k1").Key()]
		d.mu.Unlock()
		if marked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("markDone never changed the state")
		}
		time.Sleep(time.Millisecond)
	}
	d.status() // takes d.mu: must not wait for the write
	d.sf.mu.Unlock()
	<-done
}
