package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/rules/class"
)

// TestServePullClassNotOpen: through serve on the real PDS, a stranger's
// pull whose workflow names a class the operator did not mark for
// untrusted work ends error naming the class (and the classes pulls may
// name), and no step of it runs; the owner's push of the same workflow
// runs in the class.
func TestServePullClassNotOpen(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	_, base := w.Push(map[string]string{".knotless/workflows/ci.yaml": workflowFile(`
on: [push, pull]
class: large
steps:
  - name: ci
    run: echo "ran in the class"
`)})
	// The shell executor applies no bounds: the classes are names only,
	// as --class accepts them for it.
	classes, err := class.ParseSet("large", "small:untrusted")
	if err != nil {
		t.Fatal(err)
	}
	author, err := srv.CreateAccount(ctx, "author")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	head := fork.Commit("feature", map[string]string{"feature.txt": "new\n"})
	w.start(w.config(func(c *daemon.Config) {
		c.Engine.Classes = classes
		c.Sources.Pulls, c.Sources.Discover = true, true
	}))
	_, push := w.waitFinal("ci", base, time.Minute)
	if log := w.runLog(push); push.Status != "success" || !strings.Contains(log, "ran in the class") {
		t.Fatalf("the owner's push: %s %q; log:\n%s", push.Status, push.Error, log)
	}
	w.openPull(author, fork.Dir, "feature", head)
	_, pull := w.waitFinal("ci", head, time.Minute)
	const want = "class large is not open to untrusted runs (pulls); their classes on this runner: default, small"
	if pull.Status != "error" || !strings.Contains(pull.Error, want) {
		t.Errorf("the pull: %s %q, want error %q", pull.Status, pull.Error, want)
	}
	if log := w.runLog(pull); strings.Contains(log, "ran in the class") {
		t.Errorf("the pull's step ran:\n%s", log)
	}
}
