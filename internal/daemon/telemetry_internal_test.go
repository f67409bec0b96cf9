package daemon

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/observe/metrics"
	"knotless.dev/run/internal/observe/status"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/state"
)

// The daemon tells its metrics what its parts observe: a push's pickup
// and its runs' waits, the runs by status, kind and executor (its
// Name), every check written by status, and at each status change the
// queue, the runs going, the owed checks and whether it is degraded.
func TestServeTellsTheMetrics(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h, reg := metered(t, func(c *Config) { c.Engine.Executor = docker{c.Engine.Executor.(*fakeexec.Executor)} })
		h.exec.Script = func(_, id string) fakeexec.Step {
			if id == "1" {
				return fakeexec.Step{}
			}
			return fakeexec.Step{Code: 1}
		}
		h.git.SetWorkflows(rig.CI("ci", "make"), rig.CI("lint", "make", "make lint"))
		ev := rig.Push("3k1", "c1")
		ev.Push = &forge.RefUpdate{CreatedAt: time.Now().Add(-30 * time.Second).Format(time.RFC3339Nano)}
		pull := rig.Pull("did:plc:author", "3k2", "c2")
		h.lister.Set(ev, pull)
		stop := h.serve(t)
		synctest.Wait()
		stop()

		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"knotless_run_runs_total", map[string]string{"status": "success", "kind": "push", "executor": "docker"}, 1},
			{"knotless_run_runs_total", map[string]string{"status": "failure", "kind": "push", "executor": "docker"}, 1},
			{"knotless_run_runs_total", map[string]string{"status": "success", "kind": "pull", "executor": "docker"}, 1},
			{"knotless_run_runs_total", map[string]string{"status": "failure", "kind": "pull", "executor": "docker"}, 1},
			// Each of the push's two runs was queued 30 s after the push;
			// the pull's record does not say when its head moved.
			{"knotless_run_pickup_seconds", nil, 2},
			{"knotless_run_queue_wait_seconds", nil, 4},
			// The first run was taken by the free worker at once (no
			// queued record); the other three waited for it.
			{"knotless_run_check_writes_total", map[string]string{"status": "queued"}, 3},
			{"knotless_run_check_writes_total", map[string]string{"status": "running"}, 4},
			{"knotless_run_check_writes_total", map[string]string{"status": "success"}, 2},
			{"knotless_run_check_writes_total", map[string]string{"status": "failure"}, 2},
			{"knotless_run_queue_depth", nil, 0},
			{"knotless_run_runs_going", nil, 0},
			{"knotless_run_owed_checks", nil, 0},
			{"knotless_run_degraded", map[string]string{"reason": "executor"}, 0},
		} {
			if got := gathered(t, reg, tc.name, tc.labels); got != tc.want {
				t.Errorf("%s%v = %g, want %g", tc.name, tc.labels, got, tc.want)
			}
		}
		if _, sum := histogramOf(t, reg, "knotless_run_pickup_seconds"); sum != 60 {
			t.Errorf("pickup sum %g s, want 60 (two runs, 30 s each)", sum)
		}
	})
}

// metered is the rig's harness with metrics on a registry of its own,
// and that registry; more, when set, changes the config further.
func metered(t *testing.T, more func(*Config)) (*harness, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return newHarness(t, func(c *Config) {
		c.Telemetry.Metrics = m
		if more != nil {
			more(c)
		}
	}), reg
}

// The gauges follow the daemon: the queue and the runs going while a run
// holds the one worker, an owed check, a degraded executor.
func TestServeGauges(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h, reg := metered(t, nil)
		gate := make(chan struct{})
		h.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		h.git.SetWorkflows(rig.CI("ci", "make"), rig.CI("lint", "make lint"))
		h.lister.Set(rig.Push("3k1", "c1"))
		stop := h.serve(t)
		synctest.Wait()
		if q, g := gathered(t, reg, "knotless_run_queue_depth", nil), gathered(t, reg, "knotless_run_runs_going", nil); q != 1 || g != 1 {
			t.Errorf("queue depth %g, runs going %g; want 1 and 1", q, g)
		}
		// A final check the PDS does not take is owed.
		h.pds.FailNext(nil, nil, rig.ErrDown) // ci's final and lint's running checks are written, lint's final is not
		close(gate)
		synctest.Wait()
		if got := gathered(t, reg, "knotless_run_owed_checks", nil); got != 1 {
			t.Errorf("owed checks %g, want 1", got)
		}
		h.d.degrade(errors.New("token expired"))
		h.d.status()
		if got := gathered(t, reg, "knotless_run_degraded", map[string]string{"reason": "executor"}); got != 1 {
			t.Errorf("degraded %g, want 1", got)
		}
		stop()
	})
}

// The status document of a running daemon: itself, its run going with
// its step, the queued job, the owed checks, why it is degraded and the
// executor's credentials.
func TestStatusOfARunningDaemon(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		expires := time.Now().Add(time.Hour)
		h := newHarness(t, func(c *Config) {
			c.Telemetry.Credentials = func() []status.Credential { return []status.Credential{{Name: "kubernetes", Expires: expires}} }
		})
		gate := make(chan struct{})
		h.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		h.git.SetWorkflows(rig.CI("ci", "make", "make test"), rig.CI("lint", "make lint"))
		ev := rig.Push("3k1", "c1")
		h.lister.Set(ev)
		if doc := h.d.tel.Status(t.Context()); doc.Daemon.Ready || doc.Daemon.Executor != fakeexec.Name || doc.Daemon.Runner != rig.Runner {
			t.Errorf("before READY=1: %+v", doc.Daemon)
		}
		stop := h.serve(t)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		h.d.degrade(errors.New("token expired"))
		// Owed by an earlier process (the owed loop, asleep, has not
		// seen it yet).
		if err := h.d.store.Owe("k-owed", state.Owed{Event: "at://e@c0", Since: time.Now().Add(-time.Minute), Tries: 3, LastError: "429"}); err != nil {
			t.Fatal(err)
		}
		doc := h.d.tel.Status(t.Context())
		if !doc.Daemon.Ready || doc.Daemon.Stopping {
			t.Errorf("daemon %+v, want ready", doc.Daemon)
		}
		if len(doc.Runs) != 1 || len(doc.Queued) != 1 {
			t.Fatalf("runs %+v, queued %+v; want one each", doc.Runs, doc.Queued)
		}
		r, q := doc.Runs[0], doc.Queued[0]
		if r.Workflow != "ci" || r.Kind != forge.KindPush || r.Event != ev.URI.String() || r.Commit != "c1" || r.RunID == "" || r.Started.IsZero() ||
			r.Step != 1 || r.Steps != 2 || r.StepName != "ci-a" || r.StepStarted.IsZero() {
			t.Errorf("run going: %+v", r)
		}
		if q.Workflow != "lint" || q.Since.IsZero() || q.Check != forge.CheckKey(ev.Subject(), "lint") {
			t.Errorf("queued: %+v", q)
		}
		if len(doc.Owed) != 1 || doc.Owed[0].Check != "k-owed" || doc.Owed[0].Tries != 3 {
			t.Errorf("owed: %+v", doc.Owed)
		}
		if len(doc.Degraded) != 1 || doc.Degraded[0] != "executor fake unavailable: token expired" {
			t.Errorf("degraded: %q", doc.Degraded)
		}
		if len(doc.Credentials) != 1 || !doc.Credentials[0].Expires.Equal(expires) {
			t.Errorf("credentials: %+v", doc.Credentials)
		}
		close(gate)
		synctest.Wait()
		stop()
		if doc := h.d.tel.Status(t.Context()); !doc.Daemon.Stopping || len(doc.Runs) != 0 {
			t.Errorf("after the stop: %+v, runs %+v", doc.Daemon, doc.Runs)
		}
	})
}

// docker is fakeexec named as the docker executor: the runs' executor
// label is the executor's name.
type docker struct{ *fakeexec.Executor }

func (docker) Name() string { return "docker" }

// A successor's status shows the run it adopted: its session, its start
// in the earlier process and the step it goes on with; its wait queued
// was the earlier process's, so the metrics observe none.
func TestStatusOfAnAdoptedRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h, reg := metered(t, nil)
		gate := make(chan struct{})
		h.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		h.git.SetWorkflows(rig.CI("ci", "make"))
		h.lister.Set(rig.Push("3k1", "c1"))
		h.serveUntilIdle(t) // handed over at the stop
		var handed state.Run
		for _, r := range h.saved(t).Runs {
			handed = r
		}
		if handed.Handover == nil {
			t.Fatal("no run handed over")
		}
		time.Sleep(time.Minute)
		next := h.successor(t)
		stop := serve(t, next)
		synctest.Wait()
		doc := next.tel.Status(t.Context())
		if len(doc.Runs) != 1 {
			t.Fatalf("runs %+v", doc.Runs)
		}
		r := doc.Runs[0]
		if !r.Adopted || r.RunID != handed.RunID || r.Session != handed.Handover.Session.String() || !r.Started.Equal(handed.StartedAt) ||
			r.Step != 1 || r.StepName != "ci-a" {
			t.Errorf("the adopted run: %+v, want run %s of session %s started at %s, at step 1", r, handed.RunID, handed.Handover.Session, handed.StartedAt)
		}
		close(gate)
		synctest.Wait()
		stop()
		if n := gathered(t, reg, "knotless_run_queue_wait_seconds", nil); n != 1 {
			t.Errorf("queue waits observed %g, want 1: the first process's", n)
		}
	})
}

// gathered is the value of the series of name with labels (a
// histogram's count), 0 when there is none.
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	m := find(t, reg, name, labels)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("%s: a metric of an unexpected type", name)
	return 0
}

func histogramOf(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	m := find(t, reg, name, nil)
	if m == nil || m.Histogram == nil {
		t.Fatalf("no histogram %s", name)
	}
	return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
}

func find(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.Metric {
			for k, v := range labels {
				found := false
				for _, l := range m.Label {
					if l.GetName() == k {
						found = l.GetValue() == v
					}
				}
				if !found {
					continue metric
				}
			}
			return m
		}
	}
	return nil
}
