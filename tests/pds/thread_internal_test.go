package pds

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestOutlivesTheThreadThatStartedIt: a PDS started from a goroutine
// that ends locked to its thread (as clustertest's netns listeners do)
// keeps running once that thread is gone. The parent-death signal
// follows the thread that forked the process, so a PDS forked straight
// from such a thread died under the appliance tests mid-run.
func TestOutlivesTheThreadThatStartedIt(t *testing.T) {
	if testing.Short() {
		t.Skip(ErrSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type started struct {
		srv *Server
		err error
		tid int
	}
	ch := make(chan started, 1)
	dir := t.TempDir()
	var startLocked func()
	startLocked = func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if syscall.Gettid() == os.Getpid() {
			// The runtime parks the main thread rather than end it; hold
			// it and start from another thread.
			done := make(chan struct{})
			go func() { startLocked(); close(done) }()
			<-done
			return
		}
		srv, err := Start(ctx, dir)
		ch <- started{srv, err, syscall.Gettid()}
	}
	go startLocked()
	s := <-ch
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer s.srv.Stop()

	task := "/proc/self/task/" + strconv.Itoa(s.tid)
	for {
		if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("thread %d of the locked goroutine did not end", s.tid)
		case <-time.After(10 * time.Millisecond):
		}
	}
	select {
	case <-s.srv.pds.done:
		t.Fatalf("the PDS exited when the thread that started it ended:\n%s", s.srv.Logs())
	case <-time.After(5 * time.Second):
	}
	if _, err := s.srv.CreateAccount(ctx, "alice"); err != nil {
		t.Fatalf("the PDS stopped serving once the thread that started it ended: %v", err)
	}
}
