// Package livefollow follows a check's live output the way a reader
// does (dev.knotless.subscribeRunOutput), for the tests: it comes back
// with the run it followed and the offset it reached whenever the
// connection drops or the host does not have the run yet, and records
// what it got, so a test can say that a line showed before the step
// that prints it ended, and that no byte came twice and none was
// missed, across a runner's handover, a restart or a lost run.
package livefollow

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
)

// Follower follows one check's output on one host.
type Follower struct {
	c      *outputhttp.Client
	check  string
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced at each change
	runs    []string      // the runs followed, in order
	data    map[string]*bytes.Buffer
	run     string
	off     int64
	faults  []string // a chunk not at the offset reached, a gap
	conns   int
	end     *output.End
	err     error
}

// Follow follows check's output on c's host from offset 0 until its end,
// ctx's, or Close.
func Follow(ctx context.Context, c *outputhttp.Client, check string) *Follower {
	ctx, cancel := context.WithCancel(ctx)
	f := &Follower{c: c, check: check, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{}), data: map[string]*bytes.Buffer{}}
	go f.loop(ctx)
	return f
}

// Close stops following and waits for the follower's goroutine.
func (f *Follower) Close() {
	f.cancel()
	<-f.done
}

func (f *Follower) loop(ctx context.Context) {
	defer close(f.done)
	backoff := 20 * time.Millisecond
	for {
		f.mu.Lock()
		run, off := f.run, f.off
		f.conns++
		f.mu.Unlock()
		err := f.c.Resume(ctx, f.check, run, off, f.frame)
		f.mu.Lock()
		ended := f.end != nil
		if !ended && ctx.Err() != nil {
			f.err = ctx.Err()
		}
		if outputhttp.IsError(err, "FutureCursor") || outputhttp.IsError(err, "InvalidRequest") {
			f.err = err
		}
		stop := ended || f.err != nil
		f.notifyLocked()
		f.mu.Unlock()
		if stop {
			return
		}
		// The host does not have the run yet, or the connection
		// dropped (a runner stopping): come back.
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (f *Follower) frame(ev outputhttp.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	defer f.notifyLocked()
	switch {
	case ev.Run != nil:
		if ev.Run.Run != f.run {
			f.run, f.off = ev.Run.Run, 0
			f.runs = append(f.runs, f.run)
			f.data[f.run] = &bytes.Buffer{}
		}
	case ev.Chunk != nil:
		if ev.Chunk.Offset != f.off {
			f.faults = append(f.faults, fmt.Sprintf("run %s: a chunk at %d, the follower at %d", f.run, ev.Chunk.Offset, f.off))
		}
		f.data[f.run].Write(ev.Chunk.Data)
		f.off = ev.Chunk.Offset + int64(len(ev.Chunk.Data))
	case ev.Gap != nil:
		f.faults = append(f.faults, fmt.Sprintf("run %s: a gap from %d to %d", f.run, ev.Gap.Offset, ev.Gap.Next))
		f.off = ev.Gap.Next
	case ev.End != nil:
		f.end = ev.End
	}
	return nil
}

func (f *Follower) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// WaitFor waits until the run followed now has shown line, failing the
// test after timeout (a bound, not a synchronisation).
func (f *Follower) WaitFor(t testing.TB, line string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		b := f.data[f.run]
		has := b != nil && strings.Contains(b.String(), line)
		end, err, ch := f.end, f.err, f.changed
		f.mu.Unlock()
		switch {
		case has:
			return
		case end != nil || err != nil:
			t.Fatalf("%s: the output ended (%+v, %v) without %q:\n%s", f.c.Base, end, err, line, f.Bytes())
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s: %q did not show within %s; the output so far:\n%s", f.c.Base, line, timeout, f.Bytes())
		}
	}
}

// Wait waits for the output's end, failing the test after timeout, and
// returns it.
func (f *Follower) Wait(t testing.TB, timeout time.Duration) *output.End {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(timeout):
		t.Fatalf("%s: the output did not end within %s; so far:\n%s", f.c.Base, timeout, f.Bytes())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		t.Fatalf("%s: following the output: %v", f.c.Base, f.err)
	}
	return f.end
}

// Bytes are the bytes of the run followed now.
func (f *Follower) Bytes() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.data[f.run]; b != nil {
		return b.String()
	}
	return ""
}

// RunBytes are the bytes got of run.
func (f *Follower) RunBytes(run string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.data[run]; b != nil {
		return b.String()
	}
	return ""
}

// Runs are the runs followed, in order: more than one when a new run of
// the check replaced the one followed.
func (f *Follower) Runs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.runs...)
}

// Faults are the chunks that did not begin where the follower was (a
// byte twice, or a byte missed) and the gaps.
func (f *Follower) Faults() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.faults...)
}

// Conns is how many connections the follower made.
func (f *Follower) Conns() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns
}
