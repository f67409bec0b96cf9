package daemon

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The daemon returns freed memory once each time it has been idle for
// releaseAfter: not while runs go or wait, not again until something
// changed, and again after the next idle stretch.
func TestIdleReleaseOncePerIdleStretch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var busy atomic.Bool
		var released atomic.Int32
		r := newIdleRelease(func() bool { return !busy.Load() }, slog.New(slog.DiscardHandler))
		r.release = func() { released.Add(1) }
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); r.run(ctx) }()
		step := func(d time.Duration) { time.Sleep(d); synctest.Wait() }
		want := func(what string, n int32) {
			t.Helper()
			if got := released.Load(); got != n {
				t.Fatalf("%s: %d releases, want %d", what, got, n)
			}
		}

		busy.Store(true) // a run starts
		r.changedCounts()
		step(time.Minute)
		want("a minute with a run going", 0)

		busy.Store(false) // it ends
		r.changedCounts()
		step(releaseAfter - time.Second)
		want("idle for less than releaseAfter", 0)
		step(time.Second)
		want("idle for releaseAfter", 1)
		step(time.Hour)
		want("an hour more of idleness", 1)

		busy.Store(true) // a run queued, and a change while idle restarts the wait
		r.changedCounts()
		step(releaseAfter / 2)
		busy.Store(false)
		r.changedCounts()
		step(releaseAfter / 2)
		want("idle again, for half of releaseAfter", 1)
		step(releaseAfter / 2)
		want("idle again, for releaseAfter", 2)

		cancel()
		<-done
	})
}
