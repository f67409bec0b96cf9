package kubernetes_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/internal/observe/metrics"
	"knotless.dev/run/tests/clustertest"
)

// journal is an slog handler that keeps every record with its attributes
// (those of the logger's With included), as the journal gets them.
type journal struct {
	mu    *sync.Mutex
	recs  *[]entry
	attrs []slog.Attr
}

type entry struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

func newJournal() *journal { return &journal{mu: &sync.Mutex{}, recs: &[]entry{}} }

func (j *journal) Enabled(context.Context, slog.Level) bool { return true }

func (j *journal) Handle(_ context.Context, r slog.Record) error {
	e := entry{level: r.Level, msg: r.Message, attrs: map[string]slog.Value{}}
	for _, a := range j.attrs {
		e.attrs[a.Key] = a.Value.Resolve()
	}
	r.Attrs(func(a slog.Attr) bool {
		e.attrs[a.Key] = a.Value.Resolve()
		return true
	})
	j.mu.Lock()
	defer j.mu.Unlock()
	*j.recs = append(*j.recs, e)
	return nil
}

func (j *journal) WithAttrs(as []slog.Attr) slog.Handler {
	return &journal{mu: j.mu, recs: j.recs, attrs: append(slices.Clip(j.attrs), as...)}
}

func (j *journal) WithGroup(string) slog.Handler { return j }

// find returns the records with message msg.
func (j *journal) find(msg string) []entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []entry
	for _, e := range *j.recs {
		if e.msg == msg {
			out = append(out, e)
		}
	}
	return out
}

func (j *journal) dump() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var b strings.Builder
	for _, e := range *j.recs {
		b.WriteString(e.level.String() + " " + e.msg)
		for k, v := range e.attrs {
			b.WriteString(" " + k + "=" + v.String())
		}
		b.WriteString("\n")
	}
	return b.String()
}

// has checks that each record of msg (want of them) carries the fields,
// with the values given (empty: any non-empty value).
func (j *journal) has(t *testing.T, msg string, want int, fields map[string]string) []entry {
	t.Helper()
	got := j.find(msg)
	if len(got) != want {
		t.Errorf("%d %q lines, want %d; journal:\n%s", len(got), msg, want, j.dump())
		return got
	}
	for _, e := range got {
		for k, v := range fields {
			a, ok := e.attrs[k]
			switch {
			case !ok || a.String() == "":
				t.Errorf("%q line has no %s: %v", msg, k, e.attrs)
			case v != "" && a.String() != v:
				t.Errorf("%q line: %s=%s, want %s", msg, k, a, v)
			}
		}
	}
	return got
}

// gathered returns the series of family name whose labels include
// labels, or nil.
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	m := gathered(t, reg, name, nil)
	if m == nil {
		t.Fatalf("no %s", name)
	}
	return m.GetCounter().GetValue()
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	m := gathered(t, reg, name, labels)
	if m == nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

func observed(t *testing.T) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// TestLifecycleJournal: a run on the cluster logs the seed's lifecycle
// lines (Job created, pod Ready, each step's start and end, the
// transfers, the Job deleted), each naming the run, the Job, its
// namespace and image, and from the pod's Ready on the pod and its node,
// with durations; and the metrics get the session's start, the
// transfers and the steps.
func TestLifecycleJournal(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	m, reg := observed(t)
	j := newJournal()
	log := slog.New(j)
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Logger, cfg.Observer = log, m })
	eng := run.New(run.Config{Executor: ex, DefaultImage: c.Image, CleanupTimeout: time.Minute, Logger: log, Observer: m})
	runID := randomID("jr")
	checkout := t.TempDir()
	if err := os.WriteFile(filepath.Join(checkout, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := eng.Run(context.Background(), run.Request{
		RunID: runID, Workflow: parse(t, "on: push\nsteps:\n  - {name: one, run: 'cat a.txt'}\n  - {name: two, run: 'echo two > \"$KNOTLESS_RUN_OUTPUTS/two.txt\"'}\n"),
		Checkout: checkout, Outputs: filepath.Join(t.TempDir(), "out"), Trusted: true,
	})
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}

	job := map[string]string{"run": runID, "job": kubernetes.JobName(runID), "namespace": c.Namespace, "image": c.Image}
	j.has(t, "job created", 1, job)
	ready := j.has(t, "pod ready", 1, merge(job, map[string]string{"pod": "", "node": "", "after": ""}))
	if len(ready) != 1 {
		return
	}
	pod, node := ready[0].attrs["pod"].String(), ready[0].attrs["node"].String()
	if !strings.HasPrefix(pod, kubernetes.JobName(runID)+"-") {
		t.Errorf("pod ready names pod %s, not one of job %s", pod, kubernetes.JobName(runID))
	}
	if want := c.Info.NodeName; want != "" && node != want {
		t.Errorf("pod ready names node %s, want %s", node, want)
	}
	if d := ready[0].attrs["after"]; d.Kind() != slog.KindDuration || d.Duration() <= 0 {
		t.Errorf("pod ready after=%v, want a duration", d)
	}
	onPod := merge(job, map[string]string{"pod": pod, "node": node})
	j.has(t, "step started in pod", 2, merge(onPod, map[string]string{"step": ""}))
	for _, e := range j.has(t, "step ended in pod", 2, merge(onPod, map[string]string{"step": "", "exit": "0", "duration": ""})) {
		if d := e.attrs["duration"]; d.Kind() != slog.KindDuration || d.Duration() <= 0 {
			t.Errorf("step ended duration=%v, want a duration", d)
		}
	}
	// One transfer in: the step scripts travel inside the checkout's tar.
	j.has(t, "transfer in", 1, merge(onPod, map[string]string{"dir": "", "bytes": "", "duration": ""}))
	j.has(t, "transfer out", 1, merge(onPod, map[string]string{"dir": "/outputs", "bytes": "", "duration": ""}))
	j.has(t, "job deleted", 1, merge(onPod, map[string]string{"after": ""}))

	if n := histogramCount(t, reg, "knotless_run_session_ready_seconds", nil); n != 1 {
		t.Errorf("session_ready_seconds count %d, want 1", n)
	}
	if n := histogramCount(t, reg, "knotless_run_transfer_bytes", map[string]string{"direction": "in"}); n != 1 {
		t.Errorf("transfers in: %d, want 1 (the checkout with the step scripts)", n)
	}
	if n := histogramCount(t, reg, "knotless_run_transfer_seconds", map[string]string{"direction": "out"}); n != 1 {
		t.Errorf("transfers out: %d, want 1 (the outputs)", n)
	}
	if n := histogramCount(t, reg, "knotless_run_step_duration_seconds", map[string]string{"status": "success"}); n != 2 {
		t.Errorf("steps observed: %d, want 2", n)
	}
	if v := counterValue(t, reg, "knotless_run_cleanup_failures_total"); v != 0 {
		t.Errorf("cleanup failures %g after a clean run", v)
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// TestCleanupFailureCounted: a runner whose credential may not delete
// Jobs fails to stop its session; the failure is logged with the Job,
// namespace, image, pod and node and the running count, and counted in
// the metrics. The credential's expiry (a bound token's) is exported.
func TestCleanupFailureCounted(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	rules := kubecred.Rules()
	for i, r := range rules {
		if slices.Contains(r.Resources, "jobs") {
			rules[i].Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == "delete" })
		}
	}
	kubeconfig := c.ScopedKubeconfig(t, "nodelete", rules)
	m, reg := observed(t)
	j := newJournal()
	ex := newExecutor(t, c, func(cfg *kubernetes.Config) {
		cfg.Credentials.Kubeconfig, cfg.Logger, cfg.Observer = kubeconfig, slog.New(j), m
	})
	ctx := context.Background()
	runID := randomID("cf")
	sess, err := ex.Start(ctx, executor.Spec{RunID: runID, Image: c.Image, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Stop(ctx); err == nil {
		t.Fatal("Stop deleted the Job without the right to")
	}
	j.has(t, "delete job", 1, map[string]string{"run": runID, "job": kubernetes.JobName(runID), "namespace": c.Namespace,
		"image": c.Image, "pod": "", "node": "", "err": "", "cleanup_failures_total": "1"})
	if v := counterValue(t, reg, "knotless_run_cleanup_failures_total"); v != 1 {
		t.Errorf("cleanup failures %g, want 1", v)
	}
	exp := gathered(t, reg, "knotless_run_credential_expiry_seconds", map[string]string{"credential": "kubernetes"})
	if left := exp.GetGauge().GetValue(); exp == nil || left <= 0 || left > (48*time.Hour).Seconds() {
		t.Errorf("credential expiry: %v, want the bound token's seconds left", exp)
	}
	if err := c.DeleteJob(ctx, c.Namespace, kubernetes.JobName(runID)); err != nil {
		t.Error(err)
	}
}

// TestOutputsKnownEmpty: when the last step's exit line said the
// outputs directory was empty, the session gets the outputs without an
// exec (the journal's transfer out says empty_at_step_end); when the
// last step leaves a file there, written by it or by an earlier step,
// it is fetched from the pod as before.
func TestOutputsKnownEmpty(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	for _, tt := range []struct {
		name, steps string
		want        []string // the outputs' files
	}{
		{"none", "  - {name: one, run: 'echo hi'}\n", nil},
		{"written then removed", "  - {name: one, run: 'echo x > \"$KNOTLESS_RUN_OUTPUTS/x\"'}\n  - {name: two, run: 'rm \"$KNOTLESS_RUN_OUTPUTS/x\"'}\n", nil},
		{"written before the last step", "  - {name: one, run: 'echo x > \"$KNOTLESS_RUN_OUTPUTS/x\"'}\n  - {name: two, run: 'echo hi'}\n", []string{"x"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := newJournal()
			log := slog.New(j)
			ex := newExecutor(t, c, func(cfg *kubernetes.Config) { cfg.Logger = log })
			eng := run.New(run.Config{Executor: ex, DefaultImage: c.Image, CleanupTimeout: time.Minute, Logger: log})
			out := filepath.Join(t.TempDir(), "out")
			res := eng.Run(context.Background(), run.Request{
				RunID: randomID("eo"), Workflow: parse(t, "on: push\nsteps:\n"+tt.steps), Checkout: t.TempDir(), Outputs: out, Trusted: true,
			})
			if res.Status != run.Success {
				t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
			}
			entries, err := os.ReadDir(out)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range entries {
				got = append(got, e.Name())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("outputs %q, want %q", got, tt.want)
			}
			transfers := j.has(t, "transfer out", 1, map[string]string{"dir": "/outputs", "bytes": ""})
			if len(transfers) != 1 {
				return
			}
			_, known := transfers[0].attrs["empty_at_step_end"]
			if want := tt.want == nil; known != want {
				t.Errorf("transfer out without an exec (empty_at_step_end): %v, want %v; journal:\n%s", known, want, j.dump())
			}
		})
	}
}
