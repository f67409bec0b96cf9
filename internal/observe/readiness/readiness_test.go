package readiness

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestReadyFileFollowsTheDaemon: absent while starting, present from
// READY=1, not ready while the executor is degraded, gone from
// STOPPING=1; a file left by an earlier process is removed at start.
func TestReadyFileFollowsTheDaemon(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ready")
	if err := os.WriteFile(path, []byte("ready\n0 running, 0 queued\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := New(path)
	if err != nil {
		t.Fatal(err)
	}
	notReady := func(step string) {
		t.Helper()
		if err := Check(path); !errors.Is(err, ErrNotReady) {
			t.Errorf("%s: Check = %v, want not ready", step, err)
		}
	}
	notify := func(msg string) {
		t.Helper()
		if err := f.Notify(msg); err != nil {
			t.Fatalf("Notify(%q): %v", msg, err)
		}
	}
	notReady("left by an earlier process")
	notify("STATUS=starting")
	notReady("before READY=1")
	notify("READY=1")
	if err := Check(path); err != nil {
		t.Errorf("after READY=1: %v", err)
	}
	// The daemon's status line while its executor is degraded.
	notify("STATUS=1 running, 0 queued; executor degraded: cluster unreachable: dial tcp: refused")
	notReady("degraded")
	notify("STATUS=1 running, 0 queued")
	if err := Check(path); err != nil {
		t.Errorf("recovered: %v", err)
	}
	notify("WATCHDOG=1")
	if err := Check(path); err != nil {
		t.Errorf("after WATCHDOG=1: %v", err)
	}
	notify("STOPPING=1")
	notReady("after STOPPING=1")
	notify("STATUS=stopping: 1 running")
	notReady("stopping")
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ready file after STOPPING=1: %v, want removed", err)
	}
}

func TestCheckForeignFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ready")
	if err := os.WriteFile(path, []byte("something else\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Check(path); !errors.Is(err, ErrNotReady) {
		t.Errorf("Check of a foreign file = %v, want not ready", err)
	}
}
