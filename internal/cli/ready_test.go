package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadyCommand(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ready")
	if r := runCLI(t, nil, "ready", "--ready-file", path); r.code != ExitFailure || !strings.Contains(r.stdout, "starting or stopping") {
		t.Errorf("ready without the file: exit %d, stdout %q, stderr %q; want exit 1 saying why", r.code, r.stdout, r.stderr)
	}
	if err := os.WriteFile(path, []byte("ready\n0 running, 0 queued\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, nil, "ready", "--ready-file", path); r.code != 0 || r.stdout != "ready\n" {
		t.Errorf("ready with the file: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, nil, "ready"); r.code != ExitConfig || !strings.Contains(r.stderr, "--ready-file") {
		t.Errorf("ready without --ready-file: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestKubeconfigCheckInClusterOutsideAPod: --check-in-cluster names
// itself when there is no pod service account to check.
func TestKubeconfigCheckInClusterOutsideAPod(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Skip("running inside a pod")
	}
	if r := runCLI(t, nil, "kubeconfig", "--check-in-cluster"); r.code != ExitError || !strings.Contains(r.stderr, "--check-in-cluster") {
		t.Errorf("kubeconfig --check-in-cluster outside a pod: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(t, nil, "kubeconfig", "--check-in-cluster", "--check", "x"); r.code != ExitConfig || !strings.Contains(r.stderr, "not both") {
		t.Errorf("kubeconfig --check-in-cluster --check x: exit %d, stderr %q", r.code, r.stderr)
	}
}
