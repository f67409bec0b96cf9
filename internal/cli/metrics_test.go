package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/lib/tarstream"
	"knotless.dev/run/internal/observe/telemetry"
)

// TestExecutorsTellServesObserver: serve's executor observer reaches the
// executor --executor builds. The Kubernetes executor tells the token's
// expiry as it loads its kubeconfig (no cluster needed); docker tells a
// sweep that fails (no daemon needed). Without --metrics-listen there
// are no metrics, and the status still learns the expiry.
func TestExecutorsTellServesObserver(t *testing.T) {
	t.Parallel()
	exp := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	claims := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"exp":%d}`, exp.Unix()))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	writeFile(t, kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: "e30.`+claims+`.c2ln"}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: runs}}]
current-context: x
`)
	env := &Env{Getenv: func(string) string { return "" }, Logger: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		args    []string
		metrics bool
	}{
		{[]string{"--executor", "kubernetes", "--kubeconfig", kubeconfig}, false},
		{[]string{"--executor", "kubernetes", "--kubeconfig", kubeconfig, "--metrics-listen", "127.0.0.1:0"}, true},
	} {
		root, _, err := parseServe(t, append([]string{"serve", "--did", "did:plc:7u2ld3ffgzqvezmv6wxgxiix"}, tc.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		tel, obs, err := root.Serve.telemetry()
		if err != nil || (tel.Metrics != nil) != tc.metrics || obs.M != tel.Metrics {
			t.Fatalf("%v: metrics %v, observer %+v, %v", tc.args, tel.Metrics, obs, err)
		}
		if _, err := root.Serve.newExecutor(env, "did:plc:7u2ld3ffgzqvezmv6wxgxiix", 1, tarstream.Limits{}, env.Logger, obs); err != nil {
			t.Fatal(err)
		}
		if c := obs.Credentials(); len(c) != 1 || c[0].Name != "kubernetes" || !c[0].Expires.Equal(exp) {
			t.Errorf("%v: credentials %+v, want kubernetes expiring at %s", tc.args, c, exp)
		}
		// What serve hands the daemon: the metrics for the parts and the
		// engine, the listener, the executor's credentials.
		cfg, err := root.Serve.config(serveInputs{Executor: shell.New(shell.Config{}), Telemetry: tel})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Telemetry.Metrics != tel.Metrics || cfg.Telemetry.Listen != root.Serve.MetricsListen || cfg.Telemetry.Credentials == nil ||
			len(cfg.Telemetry.Credentials()) != 1 || (cfg.Engine.Observer != nil) != tc.metrics {
			t.Errorf("%v: the daemon's telemetry %+v, engine observer %v", tc.args, cfg.Telemetry.Metrics, cfg.Engine.Observer)
		}
	}

	root, _, err := parseServe(t, "serve", "--did", "did:plc:7u2ld3ffgzqvezmv6wxgxiix", "--executor", "docker",
		"--docker-host", "unix://"+filepath.Join(t.TempDir(), "none.sock"))
	if err != nil {
		t.Fatal(err)
	}
	sweeps := &sweepCount{}
	ex, err := root.Serve.newExecutor(env, "did:plc:7u2ld3ffgzqvezmv6wxgxiix", 1, tarstream.Limits{}, env.Logger, sweeps)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Sweep(context.Background(), nil); err == nil || sweeps.failed != 1 {
		t.Errorf("docker sweep without a daemon: %v, failed sweeps observed %d, want 1", err, sweeps.failed)
	}
}

// sweepCount counts the failed sweeps it is told of.
type sweepCount struct {
	telemetry.Executor
	failed int
}

func (s *sweepCount) Swept(_ int, err error) {
	if err != nil {
		s.failed++
	}
}
