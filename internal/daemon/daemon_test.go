package daemon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestPushRuns: an owner writes a repo record naming the runner and a
// refUpdate; the runner writes running (a worker was free: no queued
// record), then success, with the log and the image output as blobs.
func TestPushRuns(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	_, commit := w.Push(map[string]string{
		"greeting.txt": "hello\n",
		".knotless/workflows/build.yaml": workflowFile(`
on: [push]
branches: [main]
artifacts: [pixel.png]
steps:
  - name: greet
    run: cat greeting.txt
  - name: picture
    run: |
` + "      " + imageStep + `
      cp "$KNOTLESS_RUN_OUTPUTS/pixel.png" "$KNOTLESS_RUN_OUTPUTS/private.png"
`),
	})
	w.start(w.config())
	_, got := w.waitFinal("build", commit, 90*time.Second)
	if got.Status != "success" {
		t.Fatalf("got status %s (%s), want success", got.Status, got.Error)
	}
	if diff := cmp.Diff([]string{"running", "success"}, w.checkLog.statuses("build", commit)); diff != "" {
		t.Errorf("check writes (-want +got):\n%s", diff)
	}
	if got.Subject.Kind != "push" || got.Subject.Repo != w.RepoURI.String() || got.Subject.Ref != "refs/heads/main" {
		t.Errorf("subject %+v", got.Subject)
	}
	if len(got.Steps) != 2 || got.Steps[0].Name != "greet" || got.Steps[0].ExitCode == nil || *got.Steps[0].ExitCode != 0 {
		t.Errorf("steps %+v", got.Steps)
	}
	if got.Log == nil {
		t.Fatal("no log blob")
	}
	if log := string(w.Blob(got.Log.Ref.String())); !strings.Contains(log, "hello") || !strings.Contains(log, "==> step 1/2: greet") {
		t.Errorf("log blob lacks the step output:\n%s", log)
	}
	if len(got.Outputs) != 1 || got.Outputs[0].Path != "pixel.png" || got.Outputs[0].Blob.MimeType != "image/png" {
		t.Fatalf("outputs %+v, want pixel.png as image/png alone (private.png is not among the artifacts)", got.Outputs)
	}
	if b := w.Blob(got.Outputs[0].Blob.Ref.String()); len(b) == 0 || string(b[1:4]) != "PNG" {
		t.Errorf("output blob is not the PNG: %q", b)
	}
}

// TestCheckCutsLongStepNames: a step name longer than the lexicon's 255
// bytes, of multi-byte characters, is cut at a character (checks.Truncate)
// in the steps and as the failed step: the check is the run's own
// failure, not the minimal error check of a refused record.
func TestCheckCutsLongStepNames(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	name := strings.Repeat("é", 200) // 400 bytes
	_, commit := w.Push(map[string]string{".knotless/workflows/long.yaml": workflowFile(`
on: [push]
steps:
  - name: ` + name + `
    run: "false"
`)})
	w.start(w.config())
	_, got := w.waitFinal("long", commit, 90*time.Second)
	want := strings.Repeat("é", 126) + "..."
	if got.Status != "failure" || got.FailedStep != want || len(got.Steps) != 1 || got.Steps[0].Name != want {
		t.Errorf("check: status %s (%s), failed step %q, steps %+v; want failure in the step named %q", got.Status, got.Error, got.FailedStep, got.Steps, want)
	}
}
