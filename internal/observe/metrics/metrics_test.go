package metrics_test

import (
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/docker"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/observe/metrics"
)

// The metrics plug into the engine and the executors as their observers.
var (
	_ run.Observer      = (*metrics.Metrics)(nil)
	_ executor.Observer = (*metrics.Metrics)(nil)
)

func newMetrics(t testing.TB) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// family returns the gathered metric family name, or nil.
func family(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	return nil
}

// sample finds the series of family name with exactly labels.
func sample(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	f := family(t, reg, name)
	if f == nil {
		t.Fatalf("no family %s", name)
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if maps.Equal(got, labels) {
			return m
		}
	}
	t.Fatalf("%s has no series %v", name, labels)
	return nil
}

func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	m := sample(t, reg, name, labels)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("%s%v is not a counter or gauge", name, labels)
	return 0
}

// histogram returns a histogram series' count and sum.
func histogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	h := sample(t, reg, name, labels).GetHistogram()
	if h == nil {
		t.Fatalf("%s%v is not a histogram", name, labels)
	}
	return h.GetSampleCount(), h.GetSampleSum()
}

// TestEveryMetric calls each method and reads what it did back from the
// registry.
func TestEveryMetric(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	none := map[string]string{}

	m.EventQueued(2 * time.Second)
	m.EventQueued(4 * time.Second)
	m.RunStarted(30 * time.Second)
	m.SessionReady(1500 * time.Millisecond)
	m.Transferred(executor.DirectionIn, 1000, time.Second)
	m.Transferred(executor.DirectionIn, 3000, time.Second)
	m.Transferred(executor.DirectionOut, 500, 2*time.Second)
	m.StepEnded("success", 10*time.Second)
	m.StepEnded("failure", 3*time.Second)
	m.CacheRestored(true, 4096)
	m.CacheRestored(false, 0)
	m.CacheSaved(8192)
	m.RunFinished("failure", "pull", "kubernetes", 90*time.Second)
	m.RunFinished("success", "push", "kubernetes", 60*time.Second)
	m.RunFinished("success", "push", "kubernetes", 120*time.Second)
	m.Swept(3, nil)
	m.Swept(1, errors.New("refused"))
	m.CleanupFailed()
	m.WarmPods(2, 1)
	m.WarmTaken()
	m.WarmTaken()
	m.CheckWritten("queued")
	m.CheckWritten("running")
	m.CheckWritten("success")
	m.CheckRefused()
	m.RateLimitWaited(90 * time.Second)
	m.WriteBudget(4991)
	m.SetQueueDepth(7)
	m.SetRunsGoing(2)
	m.SetOwedChecks(3)
	m.SetDegraded("executor", true)
	m.Landed()
	m.Ejected("conflictBase")
	m.Ejected("conflictBase")
	m.Deferred("--max-queued-per-author")
	m.Refused("--max-workflows-per-event")
	m.Refused("source")
	m.TickSkipped("queued")
	m.TickSkipped("queued")

	for _, h := range []struct {
		name   string
		labels map[string]string
		count  uint64
		sum    float64
	}{
		{"knotless_run_pickup_seconds", none, 2, 6},
		{"knotless_run_queue_wait_seconds", none, 1, 30},
		{"knotless_run_session_ready_seconds", none, 1, 1.5},
		{"knotless_run_transfer_bytes", map[string]string{"direction": "in"}, 2, 4000},
		{"knotless_run_transfer_seconds", map[string]string{"direction": "in"}, 2, 2},
		{"knotless_run_transfer_bytes", map[string]string{"direction": "out"}, 1, 500},
		{"knotless_run_step_duration_seconds", map[string]string{"status": "success"}, 1, 10},
		{"knotless_run_step_duration_seconds", map[string]string{"status": "failure"}, 1, 3},
		{"knotless_run_duration_seconds", map[string]string{"status": "success", "kind": "push"}, 2, 180},
		{"knotless_run_duration_seconds", map[string]string{"status": "failure", "kind": "pull"}, 1, 90},
	} {
		count, sum := histogram(t, reg, h.name, h.labels)
		if count != h.count || sum != h.sum {
			t.Errorf("%s%v: count %d sum %g, want %d and %g", h.name, h.labels, count, sum, h.count, h.sum)
		}
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"knotless_run_runs_total", map[string]string{"status": "success", "kind": "push", "executor": "kubernetes"}, 2},
		{"knotless_run_runs_total", map[string]string{"status": "failure", "kind": "pull", "executor": "kubernetes"}, 1},
		{"knotless_run_sweeps_total", none, 2},
		{"knotless_run_sweep_errors_total", none, 1},
		{"knotless_run_swept_objects_total", none, 4},
		{"knotless_run_cleanup_failures_total", none, 1},
		{"knotless_run_warm_starts_total", none, 2},
		{"knotless_run_warm_pods", map[string]string{"state": "ready"}, 2},
		{"knotless_run_warm_pods", map[string]string{"state": "starting"}, 1},
		{"knotless_run_check_writes_total", map[string]string{"status": "queued"}, 1},
		{"knotless_run_check_writes_total", map[string]string{"status": "success"}, 1},
		{"knotless_run_check_writes_total", map[string]string{"status": "error"}, 0},
		{"knotless_run_check_refusals_total", none, 1},
		{"knotless_run_pds_ratelimit_waits_total", none, 1},
		{"knotless_run_pds_ratelimit_wait_seconds_total", none, 90},
		{"knotless_run_pds_write_budget_remaining", none, 4991},
		{"knotless_run_cache_hits_total", none, 1},
		{"knotless_run_cache_misses_total", none, 1},
		{"knotless_run_cache_bytes_total", map[string]string{"direction": "restore"}, 4096},
		{"knotless_run_cache_bytes_total", map[string]string{"direction": "save"}, 8192},
		{"knotless_run_queue_depth", none, 7},
		{"knotless_run_runs_going", none, 2},
		{"knotless_run_owed_checks", none, 3},
		{"knotless_run_degraded", map[string]string{"reason": "executor"}, 1},
		{"knotless_run_mergequeue_landings_total", none, 1},
		{"knotless_run_mergequeue_ejections_total", map[string]string{"reason": "conflictBase"}, 2},
		{"knotless_run_events_deferred_total", map[string]string{"limit": "--max-queued-per-author"}, 1},
		{"knotless_run_events_refused_total", map[string]string{"reason": "--max-workflows-per-event"}, 1},
		{"knotless_run_events_refused_total", map[string]string{"reason": "source"}, 1},
		{"knotless_run_schedule_ticks_skipped_total", map[string]string{"reason": "queued"}, 2},
	} {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	m.SetDegraded("executor", false)
	if got := value(t, reg, "knotless_run_degraded", map[string]string{"reason": "executor"}); got != 0 {
		t.Errorf("degraded after recovery = %g, want 0", got)
	}
}

// TestSeriesAnAlertReadsExistFromTheStart: the alert rules read these
// before anything happened; a counter first seen at 1 shows no increase.
func TestSeriesAnAlertReadsExistFromTheStart(t *testing.T) {
	t.Parallel()
	_, reg := newMetrics(t)
	err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP knotless_run_cleanup_failures_total Sessions whose objects could not be removed (a Job not deleted, or its pods not gone).
# TYPE knotless_run_cleanup_failures_total counter
knotless_run_cleanup_failures_total 0
# HELP knotless_run_degraded 1 while the runner is degraded for reason (executor: its executor cannot take runs), else 0.
# TYPE knotless_run_degraded gauge
knotless_run_degraded{reason="executor"} 0
# HELP knotless_run_owed_checks Final checks the PDS has not taken yet (kept in state.json, written later).
# TYPE knotless_run_owed_checks gauge
knotless_run_owed_checks 0
# HELP knotless_run_queue_depth Runs queued, waiting for a worker.
# TYPE knotless_run_queue_depth gauge
knotless_run_queue_depth 0
`), "knotless_run_cleanup_failures_total", "knotless_run_degraded", "knotless_run_owed_checks", "knotless_run_queue_depth")
	if err != nil {
		t.Error(err)
	}
	if count, _ := histogram(t, reg, "knotless_run_queue_wait_seconds", map[string]string{}); count != 0 {
		t.Errorf("queue wait count %d at start", count)
	}
	// Nothing is said about a budget the PDS has not reported, nor about
	// a credential's expiry before it is known.
	for _, name := range []string{"knotless_run_pds_write_budget_remaining", "knotless_run_credential_expiry_seconds"} {
		if f := family(t, reg, name); f != nil {
			t.Errorf("%s exported before it was known: %v", name, f)
		}
	}
}

// TestUnknownLabelValuesAreOther: a value outside a label's set is
// counted as "other", so no caller can grow the series.
func TestUnknownLabelValuesAreOther(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	m.RunFinished("exploded", "at://did:plc:x/dev.knotless.repo/r", "podman", time.Second)
	m.StepEnded("skipped", time.Second)
	m.CheckWritten("lost")
	m.Ejected("because")
	m.Deferred("--max-everything")
	m.Refused("whim")
	m.TickSkipped("moon")
	m.Retried("whim")
	m.Transferred("sideways", 1, time.Second)
	m.SetDegraded("moon", true)
	m.CredentialExpiry("did:plc:abc", time.Now().Add(time.Hour))
	other := map[string]string{"status": "other", "kind": "other", "executor": "other"}
	if got := value(t, reg, "knotless_run_runs_total", other); got != 1 {
		t.Errorf("runs_total%v = %g, want 1", other, got)
	}
	for name, labels := range map[string]map[string]string{
		"knotless_run_step_duration_seconds": {"status": "other"},
		"knotless_run_transfer_bytes":        {"direction": "other"},
	} {
		if count, _ := histogram(t, reg, name, labels); count != 1 {
			t.Errorf("%s%v count %d, want 1", name, labels, count)
		}
	}
	for name, labels := range map[string]map[string]string{
		"knotless_run_check_writes_total":           {"status": "other"},
		"knotless_run_mergequeue_ejections_total":   {"reason": "other"},
		"knotless_run_degraded":                     {"reason": "other"},
		"knotless_run_events_deferred_total":        {"limit": "other"},
		"knotless_run_events_refused_total":         {"reason": "other"},
		"knotless_run_schedule_ticks_skipped_total": {"reason": "other"},
		"knotless_run_runs_retried_total":           {"reason": "other"},
	} {
		if got := value(t, reg, name, labels); got != 1 {
			t.Errorf("%s%v = %g, want 1", name, labels, got)
		}
	}
	sample(t, reg, "knotless_run_credential_expiry_seconds", map[string]string{"credential": "other"})
}

// TestSeriesAreBounded: ten thousand repositories' worth of distinct
// values make no more series than the known sets allow.
func TestSeriesAreBounded(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	for i := range 10000 {
		v := "at://did:plc:" + strings.Repeat("x", i%50) + "/" + time.Duration(i).String()
		m.RunFinished(v, v, v, time.Second)
		m.CheckWritten(v)
		m.Ejected(v)
		m.Deferred(v)
		m.Refused(v)
		m.TickSkipped(v)
		m.Retried(v)
	}
	for name, max := range map[string]int{
		"knotless_run_runs_total":                   (len(metrics.RunStatuses) + 1) * (len(metrics.Kinds) + 1) * (len(metrics.Executors) + 1),
		"knotless_run_check_writes_total":           len(metrics.CheckStatuses) + 1,
		"knotless_run_mergequeue_ejections_total":   len(metrics.EjectionReasons) + 1,
		"knotless_run_events_deferred_total":        len(metrics.Limits) + 1,
		"knotless_run_events_refused_total":         len(metrics.RefusalReasons) + 1,
		"knotless_run_schedule_ticks_skipped_total": len(metrics.TickSkipReasons) + 1,
		"knotless_run_runs_retried_total":           len(metrics.RetryReasons) + 1,
	} {
		n, err := testutil.GatherAndCount(reg, name)
		if err != nil {
			t.Fatal(err)
		}
		if n > max || n == 0 {
			t.Errorf("%s has %d series, want 1 to %d", name, n, max)
		}
	}
}

// TestCredentialExpiryIsSecondsLeftAtScrape: the value is computed when
// scraped, so it falls as time passes without another call.
func TestCredentialExpiryIsSecondsLeftAtScrape(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t)
		m.CredentialExpiry("kubernetes", time.Now().Add(90*time.Minute))
		labels := map[string]string{"credential": "kubernetes"}
		if got := value(t, reg, "knotless_run_credential_expiry_seconds", labels); got != 5400 {
			t.Errorf("seconds left %g, want 5400", got)
		}
		time.Sleep(time.Hour)
		if got := value(t, reg, "knotless_run_credential_expiry_seconds", labels); got != 1800 {
			t.Errorf("an hour later: seconds left %g, want 1800", got)
		}
		time.Sleep(time.Hour)
		if got := value(t, reg, "knotless_run_credential_expiry_seconds", labels); got != -1800 {
			t.Errorf("past it: seconds left %g, want -1800", got)
		}
		m.CredentialExpiry("kubernetes", time.Time{})
		if f := family(t, reg, "knotless_run_credential_expiry_seconds"); f != nil {
			t.Errorf("a credential with no expiry still exported: %v", f)
		}
	})
}

// TestRuntimeAndProcessMetrics: Go's runtime and the process's metrics
// are exported beside the runner's.
func TestRuntimeAndProcessMetrics(t *testing.T) {
	t.Parallel()
	_, reg := newMetrics(t)
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_cpu_seconds_total"} {
		if family(t, reg, name) == nil {
			t.Errorf("no %s", name)
		}
	}
}

// TestNewOnARegistryTwice fails: the registry already has them.
func TestNewOnARegistryTwice(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg); err == nil {
		t.Error("a second New on the same registry succeeded")
	}
}

// TestNilMetricsObserveNothing: a part given no metrics calls them
// anyway.
func TestNilMetricsObserveNothing(t *testing.T) {
	t.Parallel()
	var m *metrics.Metrics
	m.EventQueued(time.Second)
	m.RunStarted(time.Second)
	m.RunFinished("success", "push", "shell", time.Second)
	m.StepEnded("success", time.Second)
	m.CacheRestored(true, 1)
	m.CacheSaved(1)
	m.SessionReady(time.Second)
	m.Transferred("in", 1, time.Second)
	m.Swept(1, nil)
	m.CleanupFailed()
	m.CredentialExpiry("kubernetes", time.Now())
	m.CheckWritten("queued")
	m.CheckRefused()
	m.RateLimitWaited(time.Second)
	m.WriteBudget(1)
	m.SetQueueDepth(1)
	m.SetRunsGoing(1)
	m.SetReplicasLive(3)
	m.SetOwedChecks(1)
	m.SetDegraded("executor", true)
	m.Landed()
	m.Ejected("closed")
}

// TestLabelSetsAreTheRunnersValues: the known sets are the values the
// runner's parts use.
func TestLabelSetsAreTheRunnersValues(t *testing.T) {
	t.Parallel()
	statuses := []string{string(run.Success), string(run.Failure), string(run.Error), string(run.Cancelled)}
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"run statuses", metrics.RunStatuses, statuses},
		{"check statuses", metrics.CheckStatuses, append(append([]string{forge.StatusQueued, forge.StatusRunning}, statuses...), string(run.Skipped))},
		{"kinds", metrics.Kinds, []string{forge.KindPush, forge.KindPull, forge.KindBatch}},
		{"executors", metrics.Executors, []string{kubernetes.Name, docker.Name, shell.Name}},
		{"ejection reasons", metrics.EjectionReasons, []string{forge.EjectConflictBase, forge.EjectConflictPull, forge.EjectPreflight, forge.EjectBatch, forge.EjectHeadMoved, forge.EjectClosed}},
		{"directions", metrics.Directions, []string{executor.DirectionIn, executor.DirectionOut}},
		{"credentials", metrics.Credentials, []string{kubernetes.Name}},
	} {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s (-runner's +metrics'):\n%s", c.name, diff)
		}
	}
}

// touchAll makes every series the known sets allow, "other" included:
// the most a scrape can hold.
func touchAll(m *metrics.Metrics, runs int) {
	with := func(set []string) []string { return append(slices.Clone(set), "unknown") }
	i := 0
	for i < runs {
		for _, s := range with(metrics.RunStatuses) {
			for _, k := range with(metrics.Kinds) {
				for _, e := range with(metrics.Executors) {
					m.EventQueued(time.Duration(i) * time.Second)
					m.RunStarted(time.Duration(i) * time.Second)
					m.SessionReady(time.Duration(i) * time.Millisecond)
					m.StepEnded(s, time.Duration(i)*time.Second)
					m.RunFinished(s, k, e, time.Duration(i)*time.Second)
					i++
				}
			}
		}
	}
	for _, d := range with(metrics.Directions) {
		m.Transferred(d, 1<<20, time.Second)
	}
	for _, s := range with(metrics.CheckStatuses) {
		m.CheckWritten(s)
	}
	for _, r := range with(metrics.EjectionReasons) {
		m.Ejected(r)
	}
	for _, l := range with(metrics.Limits) {
		m.Deferred(l)
	}
	for _, r := range with(metrics.RefusalReasons) {
		m.Refused(r)
	}
	for _, r := range with(metrics.TickSkipReasons) {
		m.TickSkipped(r)
	}
	for _, h := range with(metrics.InheritedHows) {
		m.Inherited(h)
	}
	m.FenceConflict()
	m.SwapLost()
	m.TakenOver(time.Second)
	for _, r := range with(metrics.DegradedReasons) {
		m.SetDegraded(r, true)
	}
	for _, c := range with(metrics.Credentials) {
		m.CredentialExpiry(c, time.Now().Add(time.Hour))
	}
	m.CacheRestored(true, 1)
	m.CacheRestored(false, 0)
	m.CacheSaved(1)
	m.Swept(1, errors.New("x"))
	m.CleanupFailed()
	m.CheckRefused()
	m.RateLimitWaited(time.Second)
	m.WriteBudget(100)
	m.SetQueueDepth(1)
	m.SetRunsGoing(1)
	m.SetReplicasLive(3)
	m.SetOwedChecks(1)
	m.Landed()
}

func scrape(t testing.TB, m *metrics.Metrics) []byte {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	// What Prometheus asks for, uncompressed: the larger answer.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s, %v", resp.Status, err)
	}
	return body
}

// TestScrapeOf1000RunsUnder64KiB: a scrape with 1,000 finished runs
// behind it, spread over every status, kind and executor (unknown ones
// too), with every other series made, stays under 64 KiB uncompressed.
func TestScrapeOf1000RunsUnder64KiB(t *testing.T) {
	t.Parallel()
	m, _ := newMetrics(t)
	touchAll(m, 1000)
	body := scrape(t, m)
	t.Logf("scrape of 1000 runs: %d bytes, %d lines", len(body), strings.Count(string(body), "\n"))
	if len(body) >= 64<<10 {
		t.Errorf("scrape is %d bytes, want under %d", len(body), 64<<10)
	}
	// A second thousand adds values, not series.
	touchAll(m, 1000)
	if again := scrape(t, m); len(again) > len(body)+len(body)/20 {
		t.Errorf("scrape grew from %d to %d bytes with 1000 more runs", len(body), len(again))
	}
}

// TestRulesNameExportedMetrics: every knotless_run_ metric the alert
// rules read is one the runner exports.
func TestRulesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile("../../../monitoring/knotless-run.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	m, reg := newMetrics(t)
	touchAll(m, 1)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range fams {
		exported[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_count", "_sum"} {
				exported[f.GetName()+s] = true
			}
		}
	}
	names := regexp.MustCompile(`\bknotless_run_[a-z_]+`).FindAllString(string(rules), -1)
	if len(names) == 0 {
		t.Fatal("the rules read no knotless_run_ metric")
	}
	for _, n := range names {
		if !exported[n] {
			t.Errorf("the rules read %s, which the runner does not export", n)
		}
	}
}

// TestOperatingGuideListsEveryMetric: the operating guide's metrics
// table names exactly the series the runner exports, and its alerts
// table exactly the rules.
func TestOperatingGuideListsEveryMetric(t *testing.T) {
	t.Parallel()
	guide, err := os.ReadFile("../../../docs/guide/operating.md")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("no docs directory in this source tree: the guide is checked from a checkout")
	}
	if err != nil {
		t.Fatal(err)
	}
	// The first cells of the table under heading.
	firstCells := func(heading string) []string {
		_, rest, ok := strings.Cut(string(guide), "\n## "+heading+"\n")
		if !ok {
			t.Fatalf("the guide has no %q section", heading)
		}
		rest, _, _ = strings.Cut(rest, "\n## ")
		var names []string
		for line := range strings.Lines(rest) {
			if !strings.HasPrefix(line, "| `") {
				continue
			}
			cell := strings.Split(line, "|")[1]
			for _, n := range strings.Split(cell, ",") {
				names = append(names, strings.Trim(strings.TrimSpace(n), "`"))
			}
		}
		slices.Sort(names)
		return names
	}

	m, reg := newMetrics(t)
	touchAll(m, 1)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for _, f := range fams {
		if n, ok := strings.CutPrefix(f.GetName(), metrics.Namespace+"_"); ok {
			exported = append(exported, n)
		}
	}
	slices.Sort(exported)
	if diff := cmp.Diff(exported, firstCells("Metrics")); diff != "" {
		t.Errorf("the guide's metrics (-exported +guide):\n%s", diff)
	}

	rules, err := os.ReadFile("../../../monitoring/knotless-run.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\S+)$`).FindAllStringSubmatch(string(rules), -1) {
		alerts = append(alerts, m[1])
	}
	slices.Sort(alerts)
	if diff := cmp.Diff(alerts, firstCells("Alert rules")); diff != "" {
		t.Errorf("the guide's alerts (-rules +guide):\n%s", diff)
	}
}
