package kubernetes

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/payload"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeexec"
	"knotless.dev/run/internal/rules/workflow"
	"knotless.dev/run/tests/clustertest"
)

// The benchmarks run on the real test cluster and report ratios measured
// in one run (the machine is shared and noisy):
//
//	go test ./internal/executor/kubernetes -run XXX -bench . -benchtime 20x
//
// See docs/performance.md for the figures.

func benchSession(b *testing.B) (*clustertest.Cluster, *Session) {
	b.Helper()
	return benchSessionWith(b, executor.Spec{})
}

// benchSessionWith starts a session of spec (its run, runner and image
// filled in).
func benchSessionWith(b *testing.B, spec executor.Spec) (*clustertest.Cluster, *Session) {
	b.Helper()
	c := clustertest.Start(b)
	ex, err := New(Config{
		Credentials: Credentials{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
		Runner:      "did:plc:bench", Pod: PodOptions{Image: c.Image}, ScheduleTimeout: 2 * time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	spec.RunID, spec.Runner, spec.Image = "bench"+strconv.FormatInt(time.Now().UnixNano()%1e9, 36), "did:plc:bench", c.Image
	sess, err := ex.Start(context.Background(), spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sess.Stop(context.Background()) })
	return c, sess.(*Session)
}

// BenchmarkStepOverhead compares a whole step (start detached, follow,
// exit status) of `true`, with the payload the engine builds for it, with
// one bare exec round trip of `true`. step/bare is what the engine waits
// for; closed/bare also waits for the step's exec to close after the pod
// removed the spool, which a run does not wait for.
func BenchmarkStepOverhead(b *testing.B) {
	_, s := benchSession(b)
	ctx := context.Background()
	var tb bytes.Buffer
	if err := tarOneFile(&tb, "1", "true\n"); err != nil {
		b.Fatal(err)
	}
	if err := s.Put(ctx, "/steps", &tb); err != nil {
		b.Fatal(err)
	}
	payload := []byte(benchPayload(b))
	var bare, step, closed time.Duration
	var bares, steps []time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		if code, err := s.exec(ctx, []string{"true"}, kubeexec.Streams{Stdout: io.Discard}); err != nil || code != 0 {
			b.Fatalf("bare exec: %d %v", code, err)
		}
		t1 := time.Now()
		id := strconv.Itoa(i + 100)
		if err := s.StartStep(ctx, id, payload); err != nil {
			b.Fatal(err)
		}
		if exit, err := s.FollowStep(ctx, id, 0, io.Discard); err != nil || exit.Code != 0 {
			b.Fatalf("step: %v %v", exit, err)
		}
		t2 := time.Now()
		s.wg.Wait()
		t3 := time.Now()
		bare += t1.Sub(t0)
		step += t2.Sub(t1)
		closed += t3.Sub(t1)
		bares, steps = append(bares, t1.Sub(t0)), append(steps, t2.Sub(t1))
	}
	b.ReportMetric(float64(bare.Milliseconds())/float64(b.N), "bare-exec-ms/op")
	b.ReportMetric(float64(step.Milliseconds())/float64(b.N), "step-ms/op")
	b.ReportMetric(float64(step)/float64(bare), "step/bare")
	b.ReportMetric(float64(closed)/float64(bare), "closed/bare")
	// Medians: one slow exec of either kind (the shared machine) moves
	// the means more than the step tool does.
	b.ReportMetric(float64(median(steps))/float64(median(bares)), "median-step/bare")
}

// benchPayload is a trivial step's payload as the engine builds it: the
// runner's variables, the working directory, the script.
func benchPayload(b *testing.B) string {
	b.Helper()
	d := executor.PodDirs()
	text, err := payload.Build(payload.Step{
		Env: []payload.Var{
			{Name: executor.EnvWork, Value: d.Work}, {Name: executor.EnvSteps, Value: d.Steps},
			{Name: executor.EnvOutputs, Value: d.Outputs}, {Name: executor.EnvRunID, Value: "bench-0123456789"},
			{Name: executor.EnvWorkflow, Value: "ci"}, {Name: executor.EnvStep, Value: "test"}, {Name: "CI", Value: "true"},
		},
		Dir: d.Work, Script: d.Steps + "/1",
	})
	if err != nil {
		b.Fatal(err)
	}
	return text
}

// BenchmarkTransfer compares Put and Get of 100 MiB (tar, digests on both
// ends) with raw `cat` over exec of the same bytes.
func BenchmarkTransfer(b *testing.B) {
	_, s := benchSession(b)
	ctx := context.Background()
	dir := b.TempDir()
	data := make([]byte, 100<<20)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, "blob"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	var tarball bytes.Buffer
	if err := tarOneFile(&tarball, "blob", string(data)); err != nil {
		b.Fatal(err)
	}
	var rawIn, put, rawOut, get time.Duration
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		t0 := time.Now()
		// wc proves every byte arrived (busybox cat > /dev/null may end
		// before reading its input).
		var count bytes.Buffer
		if code, err := s.exec(ctx, []string{"wc", "-c"}, kubeexec.Streams{Stdin: bytes.NewReader(tarball.Bytes()), Stdout: &count}); err != nil || code != 0 || strings.TrimSpace(count.String()) != strconv.Itoa(tarball.Len()) {
			b.Fatalf("raw in: %d %v, %q bytes arrived", code, err, count.String())
		}
		t1 := time.Now()
		if err := s.Put(ctx, "/work", bytes.NewReader(tarball.Bytes())); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if code, err := s.exec(ctx, []string{"sh", "-c", "cat /work/blob"}, kubeexec.Streams{Stdout: io.Discard}); err != nil || code != 0 {
			b.Fatalf("raw out: %d %v", code, err)
		}
		t3 := time.Now()
		if err := s.Get(ctx, "/work", io.Discard); err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		rawIn, put, rawOut, get = rawIn+t1.Sub(t0), put+t2.Sub(t1), rawOut+t3.Sub(t2), get+t4.Sub(t3)
	}
	mib := float64(len(data)) / (1 << 20) * float64(b.N)
	b.ReportMetric(mib/rawIn.Seconds(), "raw-in-MiB/s")
	b.ReportMetric(mib/put.Seconds(), "put-MiB/s")
	b.ReportMetric(rawIn.Seconds()/put.Seconds(), "put/raw")
	b.ReportMetric(mib/rawOut.Seconds(), "raw-out-MiB/s")
	b.ReportMetric(mib/get.Seconds(), "get-MiB/s")
	b.ReportMetric(rawOut.Seconds()/get.Seconds(), "get/raw")
}

// BenchmarkWorkflowVsKubectl runs the same three-step workflow with this
// executor and as the proof of concept did: kubectl subprocesses that
// apply a Job, wait for its pod, copy the checkout in, exec each step and
// delete the Job.
func BenchmarkWorkflowVsKubectl(b *testing.B) {
	c := clustertest.Start(b)
	if _, err := exec.LookPath("kubectl"); err != nil {
		b.Skip("kubectl not installed: the baseline needs it")
	}
	ex, err := New(Config{
		Credentials: Credentials{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
		Runner:      "did:plc:bench", Pod: PodOptions{Image: c.Image}, ScheduleTimeout: 2 * time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	wf, err := workflow.Parse("bench.yaml", []byte("on: push\nsteps:\n  - {name: a, run: 'echo a'}\n  - {name: b, run: 'ls -l'}\n  - {name: c, run: 'echo c > $KNOTLESS_RUN_OUTPUTS/c'}\n"))
	if err != nil {
		b.Fatal(err)
	}
	checkout := b.TempDir()
	if err := os.WriteFile(filepath.Join(checkout, "file"), []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	eng := run.New(run.Config{Executor: ex, DefaultImage: c.Image})
	var ours, theirs time.Duration
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		res := eng.Run(context.Background(), run.Request{RunID: fmt.Sprintf("wf%d-%d", i, time.Now().UnixNano()%1e6), Workflow: wf, Checkout: checkout, Outputs: b.TempDir(), Trusted: true})
		if res.Status != run.Success {
			b.Fatalf("run: %s %s", res.Status, res.Error)
		}
		t1 := time.Now()
		kubectlWorkflow(b, c, fmt.Sprintf("kc%d-%d", i, time.Now().UnixNano()%1e6), checkout, wf)
		t2 := time.Now()
		ours += t1.Sub(t0)
		theirs += t2.Sub(t1)
	}
	b.ReportMetric(ours.Seconds()/float64(b.N), "executor-s/op")
	b.ReportMetric(theirs.Seconds()/float64(b.N), "kubectl-s/op")
	b.ReportMetric(theirs.Seconds()/ours.Seconds(), "kubectl/executor")
}

func kubectlWorkflow(b *testing.B, c *clustertest.Cluster, name, checkout string, wf *workflow.Workflow) {
	b.Helper()
	kc := func(stdin io.Reader, args ...string) {
		cmd := exec.Command("kubectl", append([]string{"--kubeconfig", c.Kubeconfig, "-n", c.Namespace}, args...)...)
		cmd.Stdin = stdin
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	job := fmt.Sprintf(`{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":%q},"spec":{"backoffLimit":0,"template":{"metadata":{"labels":{"kc":%q}},"spec":{"restartPolicy":"Never","containers":[{"name":"run","image":%q,"imagePullPolicy":"IfNotPresent","command":["sh","-c","sleep 3600"]}]}}}}`, name, name, c.Image)
	kc(bytes.NewReader([]byte(job)), "apply", "-f", "-")
	kc(nil, "wait", "--for=condition=Ready", "pod", "-l", "kc="+name, "--timeout=120s")
	pod := "job/" + name
	kc(nil, "exec", pod, "--", "mkdir", "-p", "/work", "/outputs")
	kc(nil, "cp", checkout+"/.", firstPod(b, c, name)+":/work")
	for _, s := range wf.Steps {
		kc(nil, "exec", pod, "--", "sh", "-c", "cd /work && KNOTLESS_RUN_OUTPUTS=/outputs; export KNOTLESS_RUN_OUTPUTS; "+s.Run)
	}
	kc(nil, "cp", firstPod(b, c, name)+":/outputs", b.TempDir()+"/out")
	kc(nil, "delete", "job", name, "--wait=true", "--cascade=foreground")
}

func firstPod(b *testing.B, c *clustertest.Cluster, job string) string {
	b.Helper()
	out, err := exec.Command("kubectl", "--kubeconfig", c.Kubeconfig, "-n", c.Namespace, "get", "pods", "-l", "kc="+job, "-o", "jsonpath={.items[0].metadata.name}").Output()
	if err != nil {
		b.Fatal(err)
	}
	return string(out)
}
