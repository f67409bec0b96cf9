package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/run"
	"knotless.dev/run/tests/clustertest"
)

// The API server is down when a step ends: killed mid-step and started
// again only well after the step has exited. The runner keeps
// reattaching, learns the step's exit status and the rest of its output
// once the API server is back, and goes on to the next step. Disruptive:
// it holds the cluster alone (tests/run-all.sh runs it in its own phase).
func TestAPIServerDownAcrossStepEnd(t *testing.T) {
	c := clustertest.StartExclusive(t)
	src := `on: push
steps:
  - name: ends-while-down
    run: |
      echo before
      sleep 10
      echo after
  - name: next
    run: |
      echo second
      exit 4
`
	runID := randomID("down")
	done := make(chan *run.Result, 1)
	go func() {
		done <- engine(newExecutor(t, c, nil), c.Image).Run(context.Background(), run.Request{
			RunID: runID, Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
		})
	}()
	waitForLog(t, c, runID)
	// The step has about 6 s left; the API server stays down 20 s.
	if err := c.StopAPIServerFor(context.Background(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.Status != run.Failure || len(res.Steps) != 2 ||
		res.Steps[0].ExitCode == nil || *res.Steps[0].ExitCode != 0 ||
		res.Steps[1].ExitCode == nil || *res.Steps[1].ExitCode != 4 {
		t.Fatalf("status %s (%s), steps %+v; want the first step's exit 0 learned after the outage and the second's 4\nlog:\n%s", res.Status, res.Error, res.Steps, res.Log)
	}
	log := string(res.Log)
	for _, s := range []string{"before", "after", "second"} {
		if strings.Count(log, s) != 1 {
			t.Errorf("%q appears %d times in the log, want once:\n%s", s, strings.Count(log, s), log)
		}
	}
	assertNothingLeft(t, c)
}
