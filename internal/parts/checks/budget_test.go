package checks

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/backoff"
	"knotless.dev/run/internal/parts/state"
)

// keeperWith is keeper with ports changed by mod.
func keeperWith(t *testing.T, pds *fakePDS, mod func(*Ports)) (*Keeper, *fakeBlobs) {
	t.Helper()
	st, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	blobs := &fakeBlobs{}
	p := Ports{Blobs: blobs, Outbox: st}
	mod(&p)
	return NewKeeper(NewRecorder(pds, nil), p, backoff.Policy{First: 2 * time.Second, Max: 5 * time.Minute}, quiet), blobs
}

// Work a worker starts at once has no queued record: its running
// record is its first (a create), its final the second.
func TestUnqueuedIsCreatedRunning(t *testing.T) {
	t.Parallel()
	pds := &fakePDS{}
	k, _, _ := keeper(t, pds)
	ev := pushEvent("3k1")
	key := forge.CheckKey(ev.Subject(), "ci")
	c, ok := k.Unqueued(key, ev, "ci")
	if !ok || c.Status != "" || c.CreatedAt == "" {
		t.Fatalf("unqueued %+v %v, want an unwritten check with its creation time", c, ok)
	}
	c = k.Running(t.Context(), key, c, time.Now(), quiet)
	k.Finished(t.Context(), End{Key: key, Event: ev, Check: c, Result: &run.Result{Status: run.Success}, OutDir: t.TempDir(), Log: quiet})
	if diff := cmp.Diff([]string{key + " running", key + " success"}, pds.written); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	// A check an earlier process left running cannot start again: its
	// work is queued first.
	k.Know("left", forge.Check{Status: "running", CreatedAt: "then"})
	if _, ok := k.Unqueued("left", ev, "ci"); ok {
		t.Error("a running check is taken as unqueued")
	}
	k.Know("released", forge.Check{Status: "queued", CreatedAt: "then"})
	if c, ok := k.Unqueued("released", ev, "ci"); !ok || c.CreatedAt != "then" || c.Status != "queued" {
		t.Errorf("released check: %+v %v, want it as it is, kept", c, ok)
	}
}

// While the PDS's budget is low, queued and running records wait and
// the final one does not; a final record makes the held-back ones moot.
func TestLowBudgetHoldsBackNonFinalWrites(t *testing.T) {
	t.Parallel()
	var low atomic.Bool
	low.Store(true)
	pds := &fakePDS{}
	k, _ := keeperWith(t, pds, func(p *Ports) { p.BudgetLow = low.Load })
	ctx := t.Context()
	ev := pushEvent("3k1")
	key := forge.CheckKey(ev.Subject(), "ci")
	c, err := k.Queued(ctx, key, ev, "ci", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	c = k.Running(ctx, key, c, time.Now(), quiet)
	if len(pds.written) != 0 || k.Deferred() != 1 {
		t.Fatalf("written %v, %d held back; want nothing written, one held back", pds.written, k.Deferred())
	}
	k.Finished(ctx, End{Key: key, Event: ev, Check: c, Result: &run.Result{Status: run.Failure}, OutDir: t.TempDir(), Log: quiet})
	low.Store(false)
	k.payDeferred(ctx)
	if diff := cmp.Diff([]string{key + " failure"}, pds.written); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	if k.Deferred() != 0 {
		t.Errorf("%d writes still held back after the final", k.Deferred())
	}

	// Held back, then the budget is back before the run ends: the
	// running record is written then, once.
	low.Store(true)
	ev2 := pushEvent("3k2")
	key2 := forge.CheckKey(ev2.Subject(), "ci")
	c2, _ := k.Unqueued(key2, ev2, "ci")
	c2 = k.Running(ctx, key2, c2, time.Now(), quiet)
	if wait := k.payDeferred(ctx); wait != deferredRetry {
		t.Errorf("while low, looked again in %s, want %s", wait, deferredRetry)
	}
	low.Store(false)
	k.payDeferred(ctx)
	k.payDeferred(ctx)
	k.Finished(ctx, End{Key: key2, Event: ev2, Check: c2, Result: &run.Result{Status: run.Success}, OutDir: t.TempDir(), Log: quiet})
	if diff := cmp.Diff([]string{key + " failure", key2 + " running", key2 + " success"}, pds.written); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
}

// A held-back write whose check moved on meanwhile is not made.
func TestWriteFromMoved(t *testing.T) {
	t.Parallel()
	pds := &fakePDS{}
	r := NewRecorder(pds, nil)
	if err := r.Write(t.Context(), Start, "k", check(Running)); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteFrom(t.Context(), Queue, "k", None, check(Queued)); !errors.Is(err, ErrMoved) {
		t.Errorf("write from none of a running check: %v, want ErrMoved", err)
	}
	if err := r.WriteFrom(t.Context(), Finish, "k", Running, check(Success)); err != nil {
		t.Error(err)
	}
	if diff := cmp.Diff([]string{"k running", "k success"}, pds.written); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
}

// The budget is read from the ratelimit-* headers of record writes
// only (a read's answer states another limit, even a POST's), and is not low once its
// window has reset.
func TestRateLimitsBudget(t *testing.T) {
	t.Parallel()
	var remaining atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("RateLimit-Limit", "5000")
		w.Header().Set("RateLimit-Remaining", strconv.FormatInt(remaining.Load(), 10))
		w.Header().Set("RateLimit-Reset", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10))
	}))
	defer srv.Close()
	limits := NewRateLimits()
	hc := limits.Client(srv.Client())
	post := func(path string) {
		t.Helper()
		resp, err := hc.Post(srv.URL+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	remaining.Store(100)
	post("/xrpc/com.atproto.repo.listRecords")
	post("/xrpc/com.atproto.repo.uploadBlob")
	if limits.Low(srv.URL) {
		t.Error("low after a read's answer")
	}
	post("/xrpc/com.atproto.repo.putRecord")
	if !limits.Low(srv.URL) {
		t.Error("not low with 100 of 5000 left")
	}
	remaining.Store(4000)
	post("/xrpc/com.atproto.repo.createRecord")
	if limits.Low(srv.URL) {
		t.Error("low with 4000 of 5000 left")
	}
	remaining.Store(10)
	post("/xrpc/com.atproto.repo.applyWrites")
	limits.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if limits.Low(srv.URL) {
		t.Error("low after the window reset")
	}
}

// --log-blobs: every run's log, failed runs' only, or none.
func TestLogBlobsPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy LogBlobs
		status run.Status
		want   bool
	}{
		{"", run.Success, true}, {LogBlobsAlways, run.Success, true},
		{LogBlobsFailures, run.Success, false}, {LogBlobsFailures, run.Failure, true}, {LogBlobsFailures, run.Error, true},
		{LogBlobsNever, run.Failure, false},
	} {
		k, blobs := keeperWith(t, &fakePDS{}, func(p *Ports) { p.LogBlobs = tc.policy })
		c := k.Map(t.Context(), forge.Check{}, &run.Result{Status: tc.status, Log: []byte("log\n")}, t.TempDir(), quiet)
		if got := c.Log != nil; got != tc.want || len(blobs.types) != map[bool]int{true: 1}[tc.want] {
			t.Errorf("%q, %s: log blob %v (%d uploads), want %v", tc.policy, tc.status, got, len(blobs.types), tc.want)
		}
	}
}
