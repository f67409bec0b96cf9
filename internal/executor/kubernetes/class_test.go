package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/rules/class"
	"knotless.dev/run/tests/clustertest"
)

func classes(t *testing.T, specs ...string) class.Set {
	t.Helper()
	set, err := class.ParseSet(specs...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestPullClassNotOpen: on the real cluster, a pull whose workflow names
// a class the operator did not open to untrusted work ends error naming
// the class, and no Job or pod is made for it; the same workflow pushed
// by the owner runs in it.
func TestPullClassNotOpen(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	eng := run.New(run.Config{
		Executor: newExecutor(t, c, nil), DefaultImage: c.Image, CleanupTimeout: time.Minute,
		Classes: classes(t, "large:cpu=1,memory=256Mi", "small:cpu=500m,untrusted"),
	})
	const wf = "on: [push, pull]\nclass: large\nsteps:\n  - name: hi\n    run: echo hi\n"
	res := eng.Run(context.Background(), run.Request{RunID: randomID("class"), Workflow: parse(t, wf), Checkout: t.TempDir()})
	const want = "class large is not open to untrusted runs (pulls); their classes on this runner: default, small"
	if res.Status != run.Error || !strings.Contains(res.Error, want) {
		t.Errorf("pull: got %s %q, want error %q\nlog:\n%s", res.Status, res.Error, want, res.Log)
	}
	assertNothingLeft(t, c)
	res = eng.Run(context.Background(), run.Request{RunID: randomID("class"), Workflow: parse(t, wf), Checkout: t.TempDir(), Trusted: true})
	if res.Status != run.Success {
		t.Errorf("push: got %s %q, want success\nlog:\n%s", res.Status, res.Error, res.Log)
	}
	assertNothingLeft(t, c)
}

// TestStepPastEphemeralStorageEvicted: a step that writes past its
// class's ephemeral-storage limit has its pod evicted by the kubelet
// (alone: no other pod's disk is touched), and the run ends error in the
// kubelet's words, naming the limit, as the run's own doing (not lost to
// the infrastructure, which a retry would try again); nothing of it is
// left behind. The kubelet measures disk use periodically: the step
// writes, then waits to be evicted, bounded by the workflow's timeout
// (without the class's limit the run ends there, without the kubelet's
// words). The pod's status rarely says why (the kubelet computes it
// again from the containers' exits before sending it): the words come
// from its Evicted event. The kubelet's eviction manager acts on the
// shared node: the test runs in the phase of the tests that have the
// cluster to themselves.
func TestStepPastEphemeralStorageEvicted(t *testing.T) {
	t.Parallel()
	c := clustertest.StartExclusive(t)
	cleaner := run.NewCleaner(nil)
	eng := run.New(run.Config{
		Executor: newExecutor(t, c, nil), DefaultImage: c.Image, CleanupTimeout: time.Minute, Cleaner: cleaner,
		Classes: classes(t, "default:ephemeral-storage=32Mi"),
	})
	const wf = "on: [push]\ntimeout: 4m\nsteps:\n  - name: fill\n    run: dd if=/dev/zero of=big bs=1M count=128 && sleep 600\n"
	res := eng.Run(context.Background(), run.Request{RunID: randomID("disk"), Workflow: parse(t, wf), Checkout: t.TempDir(), Trusted: true})
	const want = "Pod ephemeral local storage usage exceeds the total limit of containers 32Mi"
	if res.Status != run.Error || !strings.Contains(res.Error, want) {
		t.Errorf("got %s %q, want error with the kubelet's %q\nlog:\n%s", res.Status, res.Error, want, res.Log)
	}
	t.Logf("run ended %s: %s", res.Status, res.Error)
	if res.Lost {
		t.Errorf("the run is marked lost to the infrastructure: the eviction was for its own limit")
	}
	if err := cleaner.Wait(context.Background()); err != nil || cleaner.Failures() != 0 {
		t.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
	}
	waitGone(t, c)
	assertNothingLeft(t, c)
}
