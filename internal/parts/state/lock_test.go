package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestLockRefusesASecondHolder: while one lock on a directory is held,
// another (a second open file, as a second process would have) is
// refused with the holder it names; once released, the next taker
// holds it and the file says so.
func TestLockRefusesASecondHolder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := Holder{PID: 101, Host: "a", Since: time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC), Invocation: "inv1"}
	l, err := TakeLock(dir, first)
	if err != nil {
		t.Fatal(err)
	}
	_, err = TakeLock(dir, Holder{PID: 202})
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("second lock: %v, want a *HeldError", err)
	}
	if diff := cmp.Diff(first, held.Holder); diff != "" {
		t.Errorf("the holder named (-want +got):\n%s", diff)
	}
	for _, want := range []string{dir, "pid 101 on host a since 2026-12-07T15:00:00Z (systemd invocation inv1)", "--state-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	next := Holder{PID: 303, Since: time.Date(2026, 12, 7, 16, 0, 0, 0, time.UTC)}
	l2, err := TakeLock(dir, next)
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	defer l2.Release()
	_, err = TakeLock(dir, Holder{PID: 404})
	if !errors.As(err, &held) {
		t.Fatalf("third lock: %v, want a *HeldError", err)
	}
	if diff := cmp.Diff(next, held.Holder); diff != "" {
		t.Errorf("the holder named after a change of holder (-want +got):\n%s", diff)
	}
	if fi, err := os.Stat(filepath.Join(dir, LockFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("lock file: %v, %v; want mode 0600", fi, err)
	}
}

// TestLockHolderNotWrittenYet: a lock whose holder has not written
// who it is is still refused, and the error says it does not know who.
func TestLockHolderNotWrittenYet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := TakeLock(dir, Holder{PID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := os.Truncate(filepath.Join(dir, LockFile), 0); err != nil {
		t.Fatal(err)
	}
	_, err = TakeLock(dir, Holder{PID: 2})
	if err == nil || !strings.Contains(err.Error(), "has not said who it is yet") {
		t.Errorf("got %v, want a refusal that does not name a holder", err)
	}
}
