package idlemem

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A Releaser returns freed memory once each time it has been idle for
// After: not while runs go or wait, not again until something
// changed, and again after the next idle stretch.
func TestReleaseOncePerIdleStretch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var busy atomic.Bool
		var released atomic.Int32
		r := New(func() bool { return !busy.Load() }, slog.New(slog.DiscardHandler))
		r.release = func() { released.Add(1) }
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); r.Run(ctx) }()
		step := func(d time.Duration) { time.Sleep(d); synctest.Wait() }
		want := func(what string, n int32) {
			t.Helper()
			if got := released.Load(); got != n {
				t.Fatalf("%s: %d releases, want %d", what, got, n)
			}
		}

		busy.Store(true) // a run starts
		r.Changed()
		step(time.Minute)
		want("a minute with a run going", 0)

		busy.Store(false) // it ends
		r.Changed()
		step(After - time.Second)
		want("idle for less than After", 0)
		step(time.Second)
		want("idle for After", 1)
		step(time.Hour)
		want("an hour more of idleness", 1)

		busy.Store(true) // a run queued, and a change while idle restarts the wait
		r.Changed()
		step(After / 2)
		busy.Store(false)
		r.Changed()
		step(After / 2)
		want("idle again, for half of After", 1)
		step(After / 2)
		want("idle again, for After", 2)

		cancel()
		<-done
	})
}
