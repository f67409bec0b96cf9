package hostlock_test

import (
	"crypto/rand"
	"errors"
	"os"
	"testing"

	"knotless.dev/run/internal/lib/hostlock"
)

// TestTakeRefusesASecondHolder: a held name refuses a second taker with
// the holder's pid (from the kernel) and what it says; released, the
// name can be taken again.
func TestTakeRefusesASecondHolder(t *testing.T) {
	t.Parallel()
	name := "knotless-run-test/" + rand.Text()
	l, err := hostlock.Take(name, []byte(`first`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = hostlock.Take(name, []byte(`second`))
	var held *hostlock.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("second take: %v, want a *HeldError", err)
	}
	if got, want := held.PID, os.Getpid(); got != want {
		t.Errorf("holder pid %d, want %d", got, want)
	}
	if got, want := held.UID, os.Getuid(); got != want {
		t.Errorf("holder uid %d, want %d", got, want)
	}
	if got := string(held.Said); got != "first" {
		t.Errorf("holder said %q, want %q", got, "first")
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := hostlock.Take(name, nil)
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	if err := l2.Release(); err != nil {
		t.Fatal(err)
	}
}
