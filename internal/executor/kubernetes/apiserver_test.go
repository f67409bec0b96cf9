package kubernetes_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/clustertest"
)

// The API server is down when a step ends: killed mid-step and started
// again only well after the step has exited. The runner keeps
// reattaching, learns the step's exit status and the rest of its output
// once the API server is back, and goes on to the next step. Disruptive:
// it holds the cluster alone (tests/run-all.sh runs it in its own phase).
func TestAPIServerDownAcrossStepEnd(t *testing.T) {
	c := clustertest.StartExclusive(t)
	stepEndsWhileUnreachable(t, c, nil, func(string) {
		if err := c.StopAPIServerFor(context.Background(), 20*time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

// The same from the runner's side only, beside the other tests: the
// runner reaches the API server through a proxy of the test's own that
// cuts every connection and refuses new ones until the test, which still
// reaches the API server, has seen the step end in the pod.
func TestAPIUnreachableAcrossStepEnd(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	proxy := c.NewAPIProxy(t)
	stepEndsWhileUnreachable(t, c, func(cfg *kubernetes.Config) { cfg.Credentials.Kubeconfig = proxy.Kubeconfig }, func(pod string) {
		proxy.Down()
		defer proxy.Up()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for {
			if code, err := c.Exec(ctx, c.Namespace, pod, "run", []string{"test", "-e", "/work/ended"}, nil, io.Discard, io.Discard); err == nil && code == 0 {
				return
			}
			select {
			case <-ctx.Done():
				t.Error("the step did not end within a minute")
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
}

// stepEndsWhileUnreachable runs two steps; once the first has started
// its 10 s sleep, cut(pod) makes the API server unreachable
// to the runner until after the step's end (it touches /work/ended as it
// ends). The first step's exit (0) and the rest of its output must be
// learned after, and the second step run (exit 4).
func stepEndsWhileUnreachable(t *testing.T, c *clustertest.Cluster, mod func(*kubernetes.Config), cut func(pod string)) {
	t.Helper()
	src := `on: push
steps:
  - name: ends-while-down
    run: |
      touch /work/started
      echo before
      sleep 10
      echo after
      touch /work/ended
  - name: next
    run: |
      echo second
      exit 4
`
	runID := randomID("down")
	var logs syncbuf.Buffer
	withLog := func(cfg *kubernetes.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		if mod != nil {
			mod(cfg)
		}
	}
	done := make(chan *run.Result, 1)
	go func() {
		done <- engine(newExecutor(t, c, withLog), c.Image).Run(context.Background(), run.Request{
			RunID: runID, Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
		})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sel := kubernetes.LabelRun + "=" + runID
	if err := c.WaitForCommand(ctx, c.Namespace, sel, "run", []string{"test", "-e", "/work/started"}); err != nil {
		t.Fatalf("the first step never started: %v", err)
	}
	pod, err := c.WaitForPod(ctx, c.Namespace, sel, clustertest.PodReady)
	if err != nil {
		t.Fatal(err)
	}
	cut(pod.Name)
	res := <-done
	if res.Status != run.Failure || len(res.Steps) != 2 ||
		res.Steps[0].ExitCode == nil || *res.Steps[0].ExitCode != 0 ||
		res.Steps[1].ExitCode == nil || *res.Steps[1].ExitCode != 4 {
		t.Fatalf("status %s (%s), steps %+v; want the first step's exit 0 learned after the outage and the second's 4\nlog:\n%s", res.Status, res.Error, res.Steps, res.Log)
	}
	// The cut came while the step ran: its stream dropped and was picked up again.
	if !strings.Contains(logs.String(), "step stream dropped; reattaching") {
		t.Errorf("the runner never lost the step's stream:\n%s", logs.String())
	}
	log := string(res.Log)
	for _, s := range []string{"before", "after", "second"} {
		if strings.Count(log, s) != 1 {
			t.Errorf("%q appears %d times in the log, want once:\n%s", s, strings.Count(log, s), log)
		}
	}
	assertNothingLeft(t, c)
}
