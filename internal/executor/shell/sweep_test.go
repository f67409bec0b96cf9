package shell_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/shell"
)

// markerPIDs lists the live processes whose command line holds marker.
func markerPIDs(t *testing.T, marker string) []string {
	t.Helper()
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(marker)) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}

func randomMarker() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "knotless-sweep-" + hex.EncodeToString(b)
}

// TestSweepKillsLeftoverSteps: after a crash (the runner process gone,
// its session object dropped without Stop), the next executor's sweep
// kills what the old run's step left running, not only its directory.
func TestSweepKillsLeftoverSteps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root := t.TempDir()
	cfg := shell.Config{Root: root, Path: os.Getenv("PATH"), Runner: "did:plc:sweeper"}
	marker := randomMarker()
	crashed, err := shell.New(cfg).Start(ctx, executor.Spec{RunID: "crashed", Runner: "did:plc:sweeper"})
	if err != nil {
		t.Fatal(err)
	}
	// Should the sweep fail, the test still ends what it started.
	t.Cleanup(func() { _ = crashed.Stop(context.Background()) })
	if err := crashed.StartStep(ctx, "1", []byte("sh -c 'sleep 300; :' "+marker+" &\nsleep 300\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(markerPIDs(t, marker)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the step's background process never appeared")
		}
		time.Sleep(50 * time.Millisecond)
	}

	swept, err := shell.New(cfg).Sweep(ctx, nil)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if len(swept) != 1 || swept[0].Name != crashed.Ref().Name {
		t.Errorf("swept %v, want %s", swept, crashed.Ref().Name)
	}
	deadline = time.Now().Add(10 * time.Second)
	for pids := markerPIDs(t, marker); len(pids) > 0; pids = markerPIDs(t, marker) {
		if time.Now().After(deadline) {
			t.Fatalf("the crashed run's step lives on after the sweep: pids %s", strings.Join(pids, " "))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(crashed.Ref().Name); !os.IsNotExist(err) {
		t.Errorf("run directory still there: %v", err)
	}
}

// TestSweepKeepsForeignDirectories: only directories this runner made
// (its marker file inside) are swept.
func TestSweepKeepsForeignDirectories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root := t.TempDir()
	mine := shell.Config{Root: root, Path: os.Getenv("PATH"), Runner: "did:plc:mine"}
	other := shell.Config{Root: root, Path: os.Getenv("PATH"), Runner: "did:plc:other"}
	foreign := filepath.Join(root, "knotless-run-x")
	if err := os.MkdirAll(filepath.Join(foreign, "work"), 0o755); err != nil {
		t.Fatal(err)
	}
	theirs, err := shell.New(other).Start(ctx, executor.Spec{RunID: "theirs"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = theirs.Stop(context.Background()) })
	ours, err := shell.New(mine).Start(ctx, executor.Spec{RunID: "ours"})
	if err != nil {
		t.Fatal(err)
	}
	swept, err := shell.New(mine).Sweep(ctx, nil)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if len(swept) != 1 || swept[0].Name != ours.Ref().Name {
		t.Errorf("swept %v, want only %s", swept, ours.Ref().Name)
	}
	for _, dir := range []string{foreign, theirs.Ref().Name} {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s was swept: %v", dir, err)
		}
	}
}
