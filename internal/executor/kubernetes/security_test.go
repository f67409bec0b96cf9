package kubernetes_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"knotless.dev/run/internal/run"
	"knotless.dev/run/tests/clustertest"
)

// Steps run as UID 1000, not root, and can still write every run
// directory, the transfer volume and /tmp; checkout in and outputs out
// work as that user.
func TestStepsRunAsNonRoot(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	src := `on: push
steps:
  - name: who
    run: |
      echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
      cat checked-out.txt
      echo w > /work/new && echo s > /steps/new && echo t > /tmp/new
      echo out > "$KNOTLESS_RUN_OUTPUTS/out.txt"
`
	checkout := t.TempDir()
	if err := writeFile(filepath.Join(checkout, "checked-out.txt"), "in\n"); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	res := engine(newExecutor(t, c, nil), c.Image).Run(context.Background(), run.Request{
		RunID: randomID("uid"), Workflow: parse(t, src), Checkout: checkout, Outputs: out, Trusted: true,
	})
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	if log := string(res.Log); !strings.Contains(log, "uid=1000 gid=1000") || !strings.Contains(log, "\nin\n") {
		t.Errorf("the step did not run as 1000:1000 with the checkout readable:\n%s", log)
	}
	if b, err := readFile(filepath.Join(out, "out.txt")); err != nil || b != "out\n" {
		t.Errorf("output out.txt: %q, %v", b, err)
	}
	assertNothingLeft(t, c)
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}
