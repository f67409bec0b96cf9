package daemon_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/executor/kubernetes"
)

// unreachableKubeconfig writes a kubeconfig whose API server is a
// loopback port with nothing listening.
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	name := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters:
- name: gone
  cluster:
    server: https://` + addr + `
    insecure-skip-tls-verify: true
users:
- name: runner
  user:
    token: not-a-real-token
contexts:
- name: gone
  context: {cluster: gone, user: runner, namespace: knotless-runs}
current-context: gone
`
	if err := os.WriteFile(name, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestUnreachableCluster: with the cluster unreachable at start the
// daemon starts anyway (READY=1, STATUS= says the executor is degraded)
// and a push gets one error check naming the cause, not a crash loop.
func TestUnreachableCluster(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	exec, err := kubernetes.New(kubernetes.Config{
		Credentials: kubernetes.Credentials{Kubeconfig: unreachableKubeconfig(t)},
		Runner:      w.Runner.DID.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notes []string
	_, commit := w.Push(map[string]string{".knotless/workflows/test.yaml": workflowFile(`
on: [push]
steps:
  - name: ok
    run: echo fine
`)})
	w.start(w.config(func(c *daemon.Config) {
		c.Engine.Executor = exec
		c.Retry = daemon.Retry{Backoff: 200 * time.Millisecond, MaxBackoff: time.Second}
		c.Notify = func(s string) { mu.Lock(); notes = append(notes, s); mu.Unlock() }
	}))
	_, got := w.waitFinal("test", commit, 90*time.Second)
	if got.Status != "error" || !strings.Contains(got.Error, "executor kubernetes unavailable") || !strings.Contains(got.Error, "connection refused") {
		t.Fatalf("check %s %q, want error naming the unreachable cluster", got.Status, got.Error)
	}
	time.Sleep(2 * time.Second) // several reconciles (poll 300 ms)
	if n := len(w.checkLog.statuses("test", commit)); n > 3 {
		t.Errorf("%d check writes (%v), want queued, running, error once", n, w.checkLog.statuses("test", commit))
	}
	mu.Lock()
	all := strings.Join(notes, "\n")
	mu.Unlock()
	if !strings.Contains(all, "READY=1") || !strings.Contains(all, "executor degraded") {
		t.Errorf("notifications %q, want READY=1 and a STATUS= saying the executor is degraded", all)
	}
	if !strings.Contains(w.logText(), "executor degraded") {
		t.Errorf("no degraded log line")
	}
}
