package kubernetes

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/rules/workflow"
	"knotless.dev/run/tests/clustertest"
)

// BenchmarkOneStepRun runs the one-step workflow (`echo hi`, a
// small checkout, outputs collected) through the engine on the cluster
// and reports, from the runner's own log timestamps, the medians of
// where the time goes: from Run's call to the Job created, to its pod
// Ready, to the verdict (Run returning its Result), and on to the
// session's clean-up done (the Job deleted and its pod gone; a Cleaner
// takes it after the verdict, and the next run starts once it is done):
//
//	go test ./internal/executor/kubernetes -run XXX -bench OneStepRun -benchtime 10x
func BenchmarkOneStepRun(b *testing.B) {
	c := clustertest.Start(b)
	marks := &logMarks{}
	log := slog.New(marks)
	ex, err := New(Config{
		Credentials: Credentials{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
		Runner:      "did:plc:bench", Pod: PodOptions{Image: c.Image}, ScheduleTimeout: 2 * time.Minute,
		Logger: log,
	})
	if err != nil {
		b.Fatal(err)
	}
	wf, err := workflow.Parse("ci.yaml", []byte("on: push\nsteps:\n  - {name: hi, run: 'echo hi'}\n"))
	if err != nil {
		b.Fatal(err)
	}
	checkout := b.TempDir()
	for name, body := range map[string]string{"README": "hello\n", "main.go": "package main\n\nfunc main() {}\n"} {
		if err := os.WriteFile(filepath.Join(checkout, name), []byte(body), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	cleaner := run.NewCleaner(log)
	eng := run.New(run.Config{Executor: ex, DefaultImage: c.Image, Runner: "did:plc:bench", Logger: log, Cleaner: cleaner})
	var created, ready, verdict, cleaned []time.Duration
	// Within ready to verdict (and on to the clean-up): the transfers in,
	// the step, the outputs out, and the Job's deletion.
	phases := []struct {
		name, from, to string
		took           []time.Duration
	}{
		{name: "in-ms", from: "pod ready", to: "step started"},
		{name: "step-ms", from: "step started", to: "step ended"},
		{name: "outputs-ms", from: "step ended", to: "outputs collected"},
		{name: "delete-ms", from: "outputs collected", to: "job deleted"},
	}
	for i := 0; b.Loop(); i++ {
		marks.reset()
		t0 := time.Now()
		res := eng.Run(context.Background(), run.Request{
			RunID: "lat" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36), Workflow: wf,
			Checkout: checkout, Outputs: filepath.Join(b.TempDir(), "out"), Trusted: true,
		})
		tv := time.Now()
		if res.Status != run.Success {
			b.Fatalf("run: %s (%s)\n%s", res.Status, res.Error, res.Log)
		}
		if err := cleaner.Wait(context.Background()); err != nil || cleaner.Failures() != 0 {
			b.Fatalf("clean-up: %v, %d failed", err, cleaner.Failures())
		}
		tc := time.Now()
		tj, tr := marks.at("job created"), marks.at("pod ready")
		if tj.IsZero() || tr.IsZero() {
			b.Fatalf("no job created or pod ready in the log")
		}
		created = append(created, tj.Sub(t0))
		ready = append(ready, tr.Sub(tj))
		verdict = append(verdict, tv.Sub(tr))
		cleaned = append(cleaned, tc.Sub(tv))
		for i := range phases {
			p := &phases[i]
			from, to := marks.at(p.from), marks.at(p.to)
			if from.IsZero() || to.IsZero() {
				b.Fatalf("no %q or %q in the log", p.from, p.to)
			}
			p.took = append(p.took, to.Sub(from))
		}
	}
	for _, p := range phases {
		b.ReportMetric(ms(median(p.took)), p.name)
	}
	b.ReportMetric(ms(median(created)), "to-job-ms")
	b.ReportMetric(ms(median(ready)), "job-to-ready-ms")
	b.ReportMetric(ms(median(verdict)), "ready-to-verdict-ms")
	b.ReportMetric(ms(median(cleaned)), "verdict-to-cleaned-ms")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// logMarks is a slog handler that keeps the time each message was
// first logged since the last reset.
type logMarks struct {
	mu    sync.Mutex
	first map[string]time.Time
}

func (m *logMarks) reset() {
	m.mu.Lock()
	m.first = map[string]time.Time{}
	m.mu.Unlock()
}

func (m *logMarks) at(msg string) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.first[msg]
}

func (m *logMarks) Enabled(context.Context, slog.Level) bool { return true }

func (m *logMarks) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.first[r.Message]; !ok && m.first != nil {
		m.first[r.Message] = r.Time
	}
	return nil
}

func (m *logMarks) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *logMarks) WithGroup(string) slog.Handler      { return m }
