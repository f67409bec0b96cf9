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
// (alone: no other pod's disk is touched), and the run ends error with
// the kubelet's reason, never success; nothing of it is left behind.
// The kubelet measures disk use periodically: the step writes, then
// waits to be evicted, bounded by the workflow's timeout. The kubelet's
// eviction manager acts on the shared node: the test runs in the phase
// of the tests that have the cluster to themselves. Whether the
// kubelet's words reach the run is logged, not asserted: on this
// machine the container was often gone ("container not found") before
// any status of the pod said why, and the run ended error all the same.
func TestStepPastEphemeralStorageEvicted(t *testing.T) {
	t.Parallel()
	c := clustertest.StartExclusive(t)
	cleaner := run.NewCleaner(nil)
	eng := run.New(run.Config{
		Executor: newExecutor(t, c, nil), DefaultImage: c.Image, CleanupTimeout: time.Minute, Cleaner: cleaner,
		Classes: classes(t, "default:ephemeral-storage=32Mi"),
	})
	const wf = "on: [push]\ntimeout: 8m\nsteps:\n  - name: fill\n    run: dd if=/dev/zero of=big bs=1M count=128 && sleep 600\n"
	res := eng.Run(context.Background(), run.Request{RunID: randomID("disk"), Workflow: parse(t, wf), Checkout: t.TempDir(), Trusted: true})
	if res.Status != run.Error {
		t.Fatalf("status %s (%s), want error: the pod was evicted for its disk\nlog:\n%s", res.Status, res.Error, res.Log)
	}
	if !strings.Contains(res.Error, "ephemeral local storage") {
		t.Logf("the kubelet's reason did not reach the run (its status came after the follow gave up)")
	}
	t.Logf("run ended %s: %s", res.Status, res.Error)
	if err := cleaner.Wait(context.Background()); err != nil || cleaner.Failures() != 0 {
		t.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
	}
	waitGone(t, c)
	assertNothingLeft(t, c)
}
