package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
)

// TestServeConcurrencyGroup: through serve, on the real PDS, pushes to
// two branches of a workflow whose concurrency group is one run one at
// a time though the runner takes two at once: the second waits, its
// check queued, until the first ends, then runs.
func TestServeConcurrencyGroup(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.start(w.config(func(c *daemon.Config) { c.Scheduler.Concurrency = 2 }))
	dir := t.TempDir()
	ledger, gate := filepath.Join(dir, "ledger"), filepath.Join(dir, "gate")
	files := map[string]string{".knotless/workflows/deploy.yaml": workflowFile(`
on: push
concurrency: deploy-${{ event.kind }}
steps:
  - name: deploy
    run: |
      echo "+ $KNOTLESS_RUN_ID" >> ` + ledger + `
      ` + waitFor(gate) + `
      echo "- $KNOTLESS_RUN_ID" >> ` + ledger + `
`)}
	_, first := w.pushBranch("a", files)
	w.waitStatus("deploy", first, "running", 2*time.Minute)
	_, second := w.pushBranch("b", files)
	w.waitStatus("deploy", second, "queued", 2*time.Minute)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, commit := range []string{first, second} {
		if _, c := w.waitFinal("deploy", commit, 2*time.Minute); c.Status != "success" {
			t.Errorf("run of %s: %s (%s)", commit, c.Status, c.Error)
		}
	}
	data, err := os.ReadFile(ledger)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	running, most := 0, 0
	for _, l := range lines {
		if strings.HasPrefix(l, "+") {
			running++
		} else {
			running--
		}
		most = max(most, running)
	}
	if most != 1 || len(lines) != 4 {
		t.Errorf("the group's runs: %q; want two, one at a time", lines)
	}
}
