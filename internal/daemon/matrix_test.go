package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
)

// TestServeMatrix: through serve, on the real PDS, a 3×2 matrix with
// one exclude and max-parallel 2 writes 5 checks, one a leg, each named
// after its values, and never has more than 2 legs running, though the
// runner takes 4 runs at once. Each leg's steps see its values.
func TestServeMatrix(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.start(w.config(func(c *daemon.Config) { c.Scheduler.Concurrency = 4 }))
	// The shell executor's steps run on the host: each leg notes its
	// start and end in one file, which the test reads.
	ledger := filepath.Join(t.TempDir(), "legs")
	_, commit := w.Push(map[string]string{
		".knotless/workflows/test.yaml": workflowFile(`
on: push
env:
  LEDGER: ` + ledger + `
matrix:
  go: ["1.22", "1.23", "1.24"]
  os: [linux, darwin]
  exclude: [{go: "1.24", os: darwin}]
  max-parallel: 2
steps:
  - name: leg
    run: |
      echo "+ $go $os" >> "$LEDGER"
      echo "leg go=$go os=$os"
      sleep 1
      echo "- $go $os" >> "$LEDGER"
  - name: linux-only
    if: matrix.os == 'linux'
    run: echo "on linux"
`),
	})
	var legs []string
	for _, g := range []string{"1.22", "1.23", "1.24"} {
		for _, os := range []string{"linux", "darwin"} {
			if g == "1.24" && os == "darwin" {
				continue
			}
			legs = append(legs, "test (go="+g+", os="+os+")")
		}
	}
	for _, name := range legs {
		_, c := w.waitFinal(name, commit, 2*time.Minute)
		log := w.runLog(c)
		want := "leg go=" + strings.TrimPrefix(strings.Split(name, ", ")[0], "test (go=")
		if c.Status != "success" || !strings.Contains(log, want) {
			t.Errorf("%s: %s; log lacks %q:\n%s", name, c.Status, want, log)
		}
		linux := strings.Contains(name, "os=linux")
		if got := c.Steps[1].Status; (got == "success") != linux {
			t.Errorf("%s: linux-only step %s", name, got)
		}
	}
	n := 0
	for _, r := range w.Checks() {
		if strings.HasPrefix(r.Value.Workflow, "test") && r.Value.Subject.Commit == commit {
			n++
		}
		if r.Value.Workflow == "test (go=1.24, os=darwin)" || r.Value.Workflow == "test" {
			t.Errorf("a check of %q: %+v", r.Value.Workflow, r.Value)
		}
	}
	if n != len(legs) {
		t.Errorf("%d checks of the matrix, want %d", n, len(legs))
	}
	data, err := os.ReadFile(ledger)
	if err != nil {
		t.Fatal(err)
	}
	running, most := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(line, "+") {
			running++
		} else {
			running--
		}
		most = max(most, running)
	}
	if most != 2 {
		t.Errorf("at most %d legs ran at once, want 2 (max-parallel):\n%s", most, data)
	}
}

// TestServeMatrixFailFast: with fail-fast, a failed leg cancels the
// legs still queued (max-parallel 1 holds them), whose checks end
// cancelled naming it; without, every leg runs.
func TestServeMatrixFailFast(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.start(w.config(func(c *daemon.Config) { c.Scheduler.Concurrency = 2 }))
	_, commit := w.Push(map[string]string{
		".knotless/workflows/ff.yaml": workflowFile(`
on: push
matrix:
  n: ["1", "2", "3"]
  max-parallel: 1
  fail-fast: true
steps:
  - run: 'test "$n" != 1'
`),
		".knotless/workflows/all.yaml": workflowFile(`
on: push
matrix:
  n: ["1", "2"]
  max-parallel: 1
steps:
  - run: 'test "$n" != 1'
`),
	})
	if _, c := w.waitFinal("ff (n=1)", commit, 90*time.Second); c.Status != "failure" {
		t.Errorf("ff (n=1): %s, want failure", c.Status)
	}
	for _, leg := range []string{"ff (n=2)", "ff (n=3)"} {
		_, c := w.waitFinal(leg, commit, 90*time.Second)
		if c.Status != "cancelled" || !strings.Contains(c.Error, "the failed leg ff (n=1) (fail-fast)") {
			t.Errorf("%s: %s %q, want cancelled by the failed leg", leg, c.Status, c.Error)
		}
	}
	if _, c := w.waitFinal("all (n=2)", commit, 90*time.Second); c.Status != "success" {
		t.Errorf("all (n=2), without fail-fast: %s, want success", c.Status)
	}
}
