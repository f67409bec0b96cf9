package daemon_test

import (
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/executor/docker"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/dockerd"
)

// needsFiles are build, which publishes bin/tool (and not notes.txt);
// test, which needs build and reads its artifact; broken, which fails;
// and after-broken, which needs broken.
var needsFiles = map[string]string{
	".knotless/workflows/build.yaml": workflowFile(`
on: push
artifacts: [bin/*]
steps:
  - name: build
    run: |
      mkdir -p "$KNOTLESS_RUN_OUTPUTS/bin"
      echo "built $KNOTLESS_RUN_ID" > "$KNOTLESS_RUN_OUTPUTS/bin/tool"
      echo private > "$KNOTLESS_RUN_OUTPUTS/notes.txt"
`),
	".knotless/workflows/test.yaml": workflowFile(`
on: push
needs: [build]
steps:
  - name: test
    run: |
      read -r line < .knotless/artifacts/build/bin/tool
      echo "$line"
      case "$line" in "built "*) ;; *) exit 1 ;; esac
      test ! -e .knotless/artifacts/build/notes.txt
`),
	".knotless/workflows/broken.yaml": workflowFile(`
on: push
steps: [{run: exit 3}]
`),
	".knotless/workflows/after-broken.yaml": workflowFile(`
on: push
needs: broken
steps: [{run: echo ran}]
`),
}

// checkNeeds asserts what serve made of needsFiles pushed as commit:
// test waited, its check queued saying for build, ran after build
// ended and found its artifact (and not the output build did not
// publish); after-broken never ran and ended skipped, naming broken.
func checkNeeds(t *testing.T, w *world, commit string, timeout time.Duration) {
	t.Helper()
	_, b := w.waitFinal("build", commit, timeout)
	_, c := w.waitFinal("test", commit, timeout)
	if b.Status != "success" || c.Status != "success" {
		t.Errorf("build %s (%s), test %s (%s); want both success\n%s", b.Status, b.Error, c.Status, c.Error, w.runLog(c))
	}
	if !w.checkLog.wrote("test", commit, "queued", "waits for build") {
		t.Errorf("test's check never said it waits for build: %v", w.checkLog.statuses("test", commit))
	}
	started, err1 := time.Parse(time.RFC3339Nano, c.StartedAt)
	finished, err2 := time.Parse(time.RFC3339Nano, b.FinishedAt)
	if err1 != nil || err2 != nil || started.Before(finished) {
		t.Errorf("test started at %s, before build finished at %s", c.StartedAt, b.FinishedAt)
	}
	_, s := w.waitFinal("after-broken", commit, timeout)
	if s.Status != "skipped" || s.Error != "needs broken, which ended failure" {
		t.Errorf("after-broken: %s %q, want skipped, needs broken, which ended failure", s.Status, s.Error)
	}
	for _, st := range w.checkLog.statuses("after-broken", commit) {
		if st == "running" {
			t.Error("after-broken ran")
		}
	}
}

// TestServeNeeds: through serve, on the real PDS and the shell
// executor, with two workers (so test could run beside build if
// nothing held it).
func TestServeNeeds(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.start(w.config(func(c *daemon.Config) { c.Scheduler.Concurrency = 2 }))
	_, commit := w.Push(needsFiles)
	checkNeeds(t, w, commit, 2*time.Minute)
}

// TestServeNeedsOnKubernetes: the same on the test cluster: the
// artifact crosses from build's pod to test's.
func TestServeNeedsOnKubernetes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	_, commit := w.Push(needsFiles)
	w.start(w.config(onCluster(t, c, w, kubernetes.PodOptions{Image: c.Image}), func(c *daemon.Config) { c.Scheduler.Concurrency = 2 }))
	checkNeeds(t, w, commit, 5*time.Minute)
}

// TestServeNeedsOnDocker: the same on a private dockerd: the artifact
// crosses from build's container to test's.
func TestServeNeedsOnDocker(t *testing.T) {
	t.Parallel()
	needPDS(t)
	d := dockerd.Start(t)
	w := newWorld(t)
	_, commit := w.Push(needsFiles)
	w.start(w.config(func(c *daemon.Config) {
		ex, err := docker.New(docker.Config{Host: d.Host(), Runner: w.Runner.DID.String(), Logger: c.Logger})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ex.Close() })
		c.Engine.Executor, c.Engine.DefaultImage = ex, d.Image()
		c.Scheduler.Concurrency = 2
	}))
	checkNeeds(t, w, commit, 3*time.Minute)
}

// wrote reports whether a check of workflow on commit was written with
// status and error text why.
func (c *checkLog) wrote(workflow, commit, status, why string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.writes {
		if w.check.Workflow == workflow && w.check.Subject.Commit == commit && w.check.Status == status && w.check.Error == why {
			return true
		}
	}
	return false
}
