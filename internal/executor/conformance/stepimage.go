package conformance

import (
	"context"
	"strings"
	"testing"

	"knotless.dev/run/internal/engine/run"
)

// testStepImages: on an executor that runs steps in images of their own,
// a step with image: runs in a container of its own (it does not see
// the run container's /tmp) that sees the checkout the previous step
// wrote, gets its secrets on stdin, masked in the log, and writes what
// the next step in the run container reads; any other executor refuses
// the workflow, naming the step.
func testStepImages(t *testing.T, h Harness) {
	const secret = "step-image-secret-8c2e"
	image := h.Image
	if image == "" {
		image = "busybox:stable" // the shell executor's: never pulled
	}
	src := strings.ReplaceAll(`on: push
secrets: [TOKEN]
steps:
  - run: echo from-the-run-container > seen; echo private > /tmp/private-marker
  - image: IMAGE
    secrets: [TOKEN]
    run: |
      cat seen
      if [ -e /tmp/private-marker ]; then echo "SAME CONTAINER"; fi
      echo "token=$TOKEN"
      echo from-the-step-container > seen2
  - run: cat seen2
`, "IMAGE", image)
	res := engine(t, h).Run(context.Background(), run.Request{
		RunID: runID(t), Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
		Secrets: map[string]string{"TOKEN": secret},
	})
	log := string(res.Log)
	if !h.StepImages {
		if res.Status != run.Error || !strings.Contains(res.Error, "step 2 names an image of its own") {
			t.Errorf("got status %s, error %q; want error naming step 2 and its image", res.Status, res.Error)
		}
		return
	}
	if res.Status != run.Success {
		t.Fatalf("status %s (%s); log:\n%s", res.Status, res.Error, log)
	}
	for _, want := range []string{"from-the-run-container", "token=***", "from-the-step-container"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log has no %q:\n%s", want, log)
		}
	}
	for _, not := range []string{"SAME CONTAINER", secret} {
		if strings.Contains(log, not) {
			t.Errorf("the log has %q:\n%s", not, log)
		}
	}
}
