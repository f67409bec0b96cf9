package daemon_test

import (
	"strings"
	"testing"
	"time"
)

// TestServeStepConditions: through serve, on the real PDS, a failed
// step skips the steps after it that have no if, an if: failure() step
// runs after it and the check shows each step's status (skipped among
// them); a continue-on-error failure leaves the run passing; a workflow
// whose if does not hold for the push writes no check.
func TestServeStepConditions(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.start(w.config())
	_, commit := w.Push(map[string]string{
		".knotless/workflows/ci.yaml": workflowFile(`
on: push
steps:
  - {name: may, run: 'exit 7', continue-on-error: true}
  - {name: sub, working-directory: sub, run: 'cat here.txt'}
  - {name: bad, run: 'exit 3'}
  - {name: never, run: 'echo never-ran'}
  - {name: report, if: failure(), run: 'echo reporting-failure'}
  - {name: on-main, if: "event.kind == 'push' && event.branch == 'main' && event.trusted", run: 'echo on-main-push'}
`),
		".knotless/workflows/lenient.yaml": workflowFile(`
on: push
steps:
  - {name: may, run: 'exit 7', continue-on-error: true}
  - {name: after, run: 'echo after-ran'}
`),
		".knotless/workflows/gated.yaml": workflowFile(`
on: push
if: event.branch == 'release'
steps:
  - run: 'true'
`),
		"sub/here.txt": "in-sub\n",
	})
	_, c := w.waitFinal("ci", commit, 90*time.Second)
	log := w.runLog(c)
	var steps []string
	for _, s := range c.Steps {
		steps = append(steps, s.Name+"="+s.Status)
	}
	want := "may=failure sub=success bad=failure never=skipped report=success on-main=skipped"
	if c.Status != "failure" || c.FailedStep != "bad" || strings.Join(steps, " ") != want {
		t.Errorf("ci: %s, failed step %q, steps %s; want failure, bad, %s\nlog:\n%s", c.Status, c.FailedStep, strings.Join(steps, " "), want, log)
	}
	for _, s := range []string{"in-sub\n", "reporting-failure\n"} {
		if !strings.Contains(log, s) {
			t.Errorf("ci: log lacks %q:\n%s", s, log)
		}
	}
	if strings.Contains(log, "never-ran") || strings.Contains(log, "on-main-push") {
		t.Errorf("ci: a skipped step ran:\n%s", log)
	}
	if _, l := w.waitFinal("lenient", commit, 90*time.Second); l.Status != "success" || len(l.Steps) != 2 || l.Steps[0].Status != "failure" {
		t.Errorf("lenient: %s, steps %+v; want success with may failed", l.Status, l.Steps)
	}
	for _, r := range w.Checks() {
		if r.Value.Workflow == "gated" {
			t.Errorf("gated, whose if does not hold, has a check: %+v", r.Value)
		}
	}
}
