package daemon

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"knotless.dev/run/internal/workflow"
)

// TestWarnUnactedOncePerWorkflow: a workflow's fields that are not acted
// on are logged the first time the daemon reads it, not at every event.
func TestWarnUnactedOncePerWorkflow(t *testing.T) {
	t.Parallel()
	wf, err := workflow.Parse(".knotless/workflows/ci.yaml", []byte("on: []\ncache: .cache\nqueue: first\nsteps:\n  - run: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := workflow.Parse(".knotless/workflows/quiet.yaml", []byte("on: push\nsteps:\n  - run: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	d := &Daemon{}
	for range 3 {
		d.warnUnacted(log, "at://did:plc:owner/dev.knotless.repo/r", []*workflow.Workflow{wf, quiet})
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "field=on") || !strings.Contains(lines[0], "line=1") ||
		!strings.Contains(lines[0], "file=.knotless/workflows/ci.yaml") {
		t.Errorf("logged:\n%s\nwant one warning, for on: [], once (cache: and queue: are acted on)", buf.String())
	}
}
