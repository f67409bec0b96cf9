package daemon

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"
)

// releaseAfter is how long the daemon stays idle (no run going or
// queued) before it returns the memory its runs freed to the system.
const releaseAfter = 10 * time.Second

// idleRelease returns freed heap memory to the system once the daemon
// has been idle for releaseAfter. The Go runtime keeps most of what a
// run freed and returns it slowly, or not at all while the heap is
// small: 44 MB resident after 20 runs and 30 s idle, 40.5 MB with this
// (BenchmarkServeRSS, docs/performance.md). It forces one collection a
// time the daemon goes idle, never while runs go.
type idleRelease struct {
	idle    func() bool // no run going or queued
	release func()      // debug.FreeOSMemory, but in tests
	log     *slog.Logger
	changed chan struct{}
}

func newIdleRelease(idle func() bool, log *slog.Logger) *idleRelease {
	return &idleRelease{idle: idle, release: releaseMemory(log), log: log, changed: make(chan struct{}, 1)}
}

// releaseMemory is the release of a running daemon: a collection, the
// freed memory returned, what it returned logged.
func releaseMemory(log *slog.Logger) func() {
	return func() {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		debug.FreeOSMemory()
		runtime.ReadMemStats(&after)
		log.Debug("idle: freed memory returned to the system",
			"released_bytes", int64(after.HeapReleased)-int64(before.HeapReleased), "heap_inuse_bytes", after.HeapInuse)
	}
}

// changedCounts is told that the runs going or queued changed.
func (r *idleRelease) changedCounts() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// run releases memory releaseAfter after each change that left the
// daemon idle, until ctx ends.
func (r *idleRelease) run(ctx context.Context) {
	var timer *time.Timer
	var fired <-chan time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.changed:
			if timer != nil {
				timer.Stop()
				timer, fired = nil, nil
			}
			if r.idle() {
				timer = time.NewTimer(releaseAfter)
				fired = timer.C
			}
		case <-fired:
			timer, fired = nil, nil
			if r.idle() {
				r.release()
			}
		}
	}
}
