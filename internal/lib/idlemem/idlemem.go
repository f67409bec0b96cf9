// Package idlemem returns the memory a process's work freed to the
// system once the process has been idle for a while. The Go runtime
// keeps most of what a run freed and returns it slowly, or not at all
// while the heap is small: 44 MB resident after 20 runs and 30 s idle,
// 40.5 MB with this (BenchmarkServeRSS, docs/performance.md). It forces
// one collection each time the process goes idle, never while work goes.
package idlemem

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"time"
)

// After is how long the process stays idle (no run going or queued)
// before it returns the memory its runs freed to the system.
const After = 10 * time.Second

// Releaser returns freed heap memory to the system once the process has
// been idle for After.
type Releaser struct {
	idle    func() bool // no run going or queued
	release func()      // debug.FreeOSMemory, but in tests
	changed chan struct{}
}

// New returns a Releaser that asks idle whether the process is idle,
// and logs to log what each release returned.
func New(idle func() bool, log *slog.Logger) *Releaser {
	return &Releaser{idle: idle, release: releaseMemory(log), changed: make(chan struct{}, 1)}
}

// releaseMemory is the release of a running process: a collection, the
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

// Changed tells r that the runs going or queued changed. It never
// blocks.
func (r *Releaser) Changed() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// Run releases memory After after each change that left the process
// idle, until ctx ends.
func (r *Releaser) Run(ctx context.Context) {
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
				timer = time.NewTimer(After)
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
