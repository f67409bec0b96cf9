// Package metrics is the runner's Prometheus metrics: one type, Metrics,
// holding every series the daemon exports, registered on a registry its
// caller passes in (no package globals), with a typed method for each
// thing the runner's parts observe.
//
// Labels are bounded: a label takes its values from a fixed set (status,
// kind, executor, reason, direction, credential), and a value outside
// it is counted as "other". No series is labelled with a run, check,
// repository or commit, so a runner with 10,000 repositories has the
// same series as one with a single repository.
//
// Every method is safe for concurrent use and on a nil *Metrics (it
// observes nothing), so a part given no metrics needs no check.
package metrics

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric of the runner.
const Namespace = "knotless_run"

// Other is the label value of anything outside a label's known set.
const Other = "other"

// FenceKinds' values.
const (
	FenceExists   = "exists"
	FenceLostSwap = "lost_swap"
)

// The known values of each label. A value outside its set is Other.
var (
	// RunStatuses are the final statuses of a run (run.Status).
	RunStatuses = []string{"success", "failure", "error", "cancelled"}
	// CheckStatuses are the statuses a check record is written with.
	CheckStatuses = []string{"queued", "running", "success", "failure", "error", "cancelled", "skipped"}
	// Kinds are the kinds of work (forge.KindPush, KindPull, KindBatch).
	Kinds = []string{"push", "pull", "batch"}
	// Executors are the executors' names.
	Executors = []string{"kubernetes", "docker", "shell"}
	// EjectionReasons are the merge queue's reasons (forge.Eject*).
	EjectionReasons = []string{"conflictBase", "conflictPull", "preflight", "batch", "headMoved", "closed"}
	// Limits are the flags of the caps an event may wait for or be
	// refused by (intake's decisions).
	Limits = []string{"--max-workflows-per-event", "--max-queued-per-author", "--max-check-writes-per-author"}
	// RefusalReasons are why an event is refused: a limit, or its
	// source (an unusable git source).
	RefusalReasons = append([]string{"source"}, Limits...)
	// TickSkipReasons are why a schedule's tick is skipped.
	TickSkipReasons = []string{"queued"}
	// InheritedHows are what a process did with a run an earlier one
	// left going: adopted at its handover ("handover"), taken up from
	// its checkpoint after that process died ("checkpoint"), ended error
	// because a step may have started and it could not go on ("ended"),
	// or run again because no step had started ("again"); with
	// replicas, taken over from a replica that died ("replica"), or
	// left to another replica that had claimed it ("elsewhere").
	InheritedHows = []string{"handover", "checkpoint", "ended", "again", "replica", "elsewhere"}
	// RetryReasons are why a run was tried again (a workflow's retry):
	// the infrastructure lost it ("infrastructure"), or it ended failure
	// or error and the workflow says retry when: always ("failure").
	RetryReasons = []string{"infrastructure", "failure"}
	// FenceKinds are the fence's conflicts: a create of a run's objects
	// found them there ("exists": AlreadyExists), or a check write lost
	// its compare-and-swap to another writer ("lost_swap").
	FenceKinds = []string{FenceExists, FenceLostSwap}
	// DegradedReasons are why the runner may be degraded: "executor",
	// its executor cannot take runs (cluster unreachable, credentials
	// expired).
	DegradedReasons = []string{"executor"}
	// Credentials are the credentials whose expiry is exported:
	// "kubernetes", the executor's token.
	Credentials = []string{"kubernetes"}
	// Directions are the directions of a transfer into or out of a
	// session (executor.DirectionIn, DirectionOut).
	Directions = []string{"in", "out"}
)

// Buckets of the histograms, in seconds or bytes. Few of them: each is a
// line of every scrape.
var (
	pickupBuckets   = []float64{1, 5, 15, 30, 60, 120, 300, 900, 1800}
	waitBuckets     = []float64{1, 5, 15, 60, 300, 900, 1800, 3600}
	readyBuckets    = []float64{0.5, 1, 2.5, 5, 10, 30, 60, 300}
	stepBuckets     = []float64{1, 5, 15, 60, 300, 900, 1800, 3600}
	runBuckets      = []float64{10, 30, 60, 300, 900, 1800, 3600, 7200}
	transferBytes   = []float64{1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30}
	transferSeconds = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 15, 60}
)

// Metrics holds every metric of the runner.
type Metrics struct {
	reg *prometheus.Registry

	pickup       prometheus.Histogram
	queueWait    prometheus.Histogram
	sessionReady prometheus.Histogram
	takeover     prometheus.Histogram
	stepDuration *prometheus.HistogramVec
	runDuration  *prometheus.HistogramVec
	xferBytes    *prometheus.HistogramVec
	xferSeconds  *prometheus.HistogramVec

	runs            *prometheus.CounterVec
	sweeps          prometheus.Counter
	sweepErrors     prometheus.Counter
	swept           prometheus.Counter
	cleanupFailures prometheus.Counter
	warmTaken       prometheus.Counter
	checkWrites     *prometheus.CounterVec
	checkRefusals   prometheus.Counter
	rateWaits       prometheus.Counter
	rateWaitSeconds prometheus.Counter
	cacheHits       prometheus.Counter
	cacheMisses     prometheus.Counter
	cacheBytes      *prometheus.CounterVec
	landings        prometheus.Counter
	ejections       *prometheus.CounterVec
	deferred        *prometheus.CounterVec
	refused         *prometheus.CounterVec
	ticksSkipped    *prometheus.CounterVec
	inherited       *prometheus.CounterVec
	retries         *prometheus.CounterVec
	fence           *prometheus.CounterVec

	queueDepth  prometheus.Gauge
	runsGoing   prometheus.Gauge
	owedChecks  prometheus.Gauge
	warmPods    *prometheus.GaugeVec
	writeBudget *prometheus.GaugeVec // no labels: absent until the PDS reports it
	replicas    *prometheus.GaugeVec // no labels: absent for one process
	degraded    *prometheus.GaugeVec
	expiry      *expiryCollector
}

// New makes the runner's metrics and registers them on reg, with the Go
// runtime's and the process's collectors. It fails when reg already holds
// any of them.
func New(reg *prometheus.Registry) (*Metrics, error) {
	m := &Metrics{reg: reg}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets})
	}
	histogramVec := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets}, labels)
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
	}

	m.pickup = histogram("pickup_seconds", "Time from an event (a push, pull or batch record) to its run queued.", pickupBuckets)
	m.queueWait = histogram("queue_wait_seconds", "Time a run waited queued before it started running.", waitBuckets)
	m.takeover = histogram("takeover_seconds", "Time from this process's start to each run an earlier process left going (handed over, or taken up after it died) going on here; with replicas, for a run taken over from a replica that died, from that replica's last Lease renewal.", readyBuckets)
	m.sessionReady = histogram("session_ready_seconds", "Time from a run's session created (a Job) to ready (its pod Ready).", readyBuckets)
	m.stepDuration = histogramVec("step_duration_seconds", "Duration of a step, by how it ended.", stepBuckets, "status")
	m.runDuration = histogramVec("duration_seconds", "Duration of a finished run, by status and kind.", runBuckets, "status", "kind")
	m.xferBytes = histogramVec("transfer_bytes", "Size of a tar stream into (in) or out of (out) a session.", transferBytes, "direction")
	m.xferSeconds = histogramVec("transfer_seconds", "Duration of a tar stream into (in) or out of (out) a session.", transferSeconds, "direction")

	m.runs = counterVec("runs_total", "Runs finished, by status, kind and executor.", "status", "kind", "executor")
	m.sweeps = counter("sweeps_total", "Sweeps of sessions no run owns (at start, and again while they fail).")
	m.sweepErrors = counter("sweep_errors_total", "Sweeps that did not finish (the backend unreachable, a deletion refused).")
	m.swept = counter("swept_objects_total", "Sessions of earlier processes removed by sweeps.")
	m.cleanupFailures = counter("cleanup_failures_total", "Sessions whose objects could not be removed (a Job not deleted, or its pods not gone).")
	m.warmTaken = counter("warm_starts_total", "Runs started on a pod kept warm (serve --warm-pods).")
	m.checkWrites = counterVec("check_writes_total", "Check records written, by the status written.", "status")
	m.checkRefusals = counter("check_refusals_total", "Check records the PDS refused as invalid (replaced by a minimal error check).")
	m.rateWaits = counter("pds_ratelimit_waits_total", "Waits for the PDS's rate limit to reset before writing.")
	m.rateWaitSeconds = counter("pds_ratelimit_wait_seconds_total", "Time spent waiting for the PDS's rate limit to reset.")
	m.cacheHits = counter("cache_hits_total", "Cache paths restored from a layer.")
	m.cacheMisses = counter("cache_misses_total", "Cache paths a run went without (no layer it may read, or a restore that failed).")
	m.cacheBytes = counterVec("cache_bytes_total", "Bytes of cache layers restored (restore) and saved (save).", "direction")
	m.landings = counter("mergequeue_landings_total", "Merge-queue batches landed.")
	m.ejections = counterVec("mergequeue_ejections_total", "Pulls ejected from the merge queue, by reason.", "reason")
	m.deferred = counterVec("events_deferred_total", "Times an event waited for its author's caps, by the limit's flag.", "limit")
	m.refused = counterVec("events_refused_total", "Events given one error check instead of runs, by the limit's flag or source.", "reason")
	m.ticksSkipped = counterVec("schedule_ticks_skipped_total", "Schedule ticks not run, by reason (queued: the workflow's previous tick was still queued).", "reason")
	m.fence = counterVec("fence_conflicts_total", "Conflicts the fence resolved, by kind: exists (a create of a run's objects found them there: AlreadyExists; the run is another driver's, or an earlier one's deletion was waited out), lost_swap (a check write lost its compare-and-swap; the record was read again).", "kind")
	m.inherited = counterVec("runs_inherited_total", "Runs an earlier process left going, by what this one did: handover (adopted), checkpoint (taken up after that process died), ended (error: a step may have started and it could not go on), again (no step had started: run again), replica (with replicas: taken over from a replica that died), elsewhere (with replicas: another replica had claimed it).", "how")

	m.retries = counterVec("runs_retried_total", "Runs tried again by their workflow's retry, by reason: infrastructure (the infrastructure lost the run: its pod disrupted or deleted, its node gone), failure (it ended failure or error, and the workflow retries when: always).", "reason")

	m.queueDepth = gauge("queue_depth", "Runs queued, waiting for a worker.")
	m.runsGoing = gauge("runs_going", "Runs going (started, not final).")
	m.owedChecks = gauge("owed_checks", "Final checks the PDS has not taken yet (kept in state.json, written later).")
	m.warmPods = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "warm_pods",
		Help: "Pods kept warm for runs (serve --warm-pods), by state: ready, or starting."}, []string{"state"})
	m.writeBudget = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "pds_write_budget_remaining",
		Help: "Write points left in the PDS's rate-limit window, as its ratelimit-remaining header last said; absent until it says."}, nil)
	m.replicas = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "replicas_live",
		Help: "The runner's live replicas as this process sees them (serve --replicas: Leases renewed within their duration, this one's included); absent for one process."}, nil)
	m.degraded = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "degraded",
		Help: "1 while the runner is degraded for reason (executor: its executor cannot take runs), else 0."}, []string{"reason"})
	m.expiry = newExpiryCollector(prometheus.NewDesc(Namespace+"_credential_expiry_seconds",
		"Seconds until credential expires (negative once it has), at the time of the scrape.", []string{"credential"}, nil))

	// Series an alert reads from the start: a counter first seen at 1
	// shows no increase.
	for _, r := range DegradedReasons {
		m.degraded.WithLabelValues(r)
	}
	for _, s := range CheckStatuses {
		m.checkWrites.WithLabelValues(s)
	}
	for _, r := range RetryReasons {
		m.retries.WithLabelValues(r)
	}
	for _, d := range []string{"restore", "save"} {
		m.cacheBytes.WithLabelValues(d)
	}
	for _, s := range []string{"ready", "starting"} {
		m.warmPods.WithLabelValues(s)
	}

	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.pickup, m.queueWait, m.sessionReady, m.takeover, m.stepDuration, m.runDuration, m.xferBytes, m.xferSeconds,
		m.runs, m.sweeps, m.sweepErrors, m.swept, m.cleanupFailures, m.warmTaken, m.checkWrites, m.checkRefusals,
		m.rateWaits, m.rateWaitSeconds, m.cacheHits, m.cacheMisses, m.cacheBytes, m.landings, m.ejections,
		m.deferred, m.refused, m.ticksSkipped, m.inherited, m.retries, m.fence,
		m.queueDepth, m.runsGoing, m.owedChecks, m.warmPods, m.writeBudget, m.replicas, m.degraded, m.expiry,
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

// Handler serves the registry's metrics in Prometheus' exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// known returns v when set holds it, else Other.
func known(set []string, v string) string {
	for _, s := range set {
		if s == v {
			return v
		}
	}
	return Other
}

// EventQueued: a run was queued pickup after its event (the record's
// time).
func (m *Metrics) EventQueued(pickup time.Duration) {
	if m == nil {
		return
	}
	m.pickup.Observe(pickup.Seconds())
}

// RunStarted: a run started running after waiting queued for wait.
func (m *Metrics) RunStarted(wait time.Duration) {
	if m == nil {
		return
	}
	m.queueWait.Observe(wait.Seconds())
}

// RunFinished: a run ended with a final status after d.
func (m *Metrics) RunFinished(status, kind, executor string, d time.Duration) {
	if m == nil {
		return
	}
	status, kind = known(RunStatuses, status), known(Kinds, kind)
	m.runs.WithLabelValues(status, kind, known(Executors, executor)).Inc()
	m.runDuration.WithLabelValues(status, kind).Observe(d.Seconds())
}

// StepEnded implements run.Observer.
func (m *Metrics) StepEnded(status string, d time.Duration) {
	if m == nil {
		return
	}
	m.stepDuration.WithLabelValues(known(RunStatuses, status)).Observe(d.Seconds())
}

// CacheRestored implements run.Observer.
func (m *Metrics) CacheRestored(hit bool, bytes int64) {
	if m == nil {
		return
	}
	if !hit {
		m.cacheMisses.Inc()
		return
	}
	m.cacheHits.Inc()
	m.cacheBytes.WithLabelValues("restore").Add(float64(bytes))
}

// CacheSaved implements run.Observer.
func (m *Metrics) CacheSaved(bytes int64) {
	if m == nil {
		return
	}
	m.cacheBytes.WithLabelValues("save").Add(float64(bytes))
}

// SessionReady implements executor.Observer.
func (m *Metrics) SessionReady(wait time.Duration) {
	if m == nil {
		return
	}
	m.sessionReady.Observe(wait.Seconds())
}

// Transferred implements executor.Observer.
func (m *Metrics) Transferred(direction string, bytes int64, d time.Duration) {
	if m == nil {
		return
	}
	direction = known(Directions, direction)
	m.xferBytes.WithLabelValues(direction).Observe(float64(bytes))
	m.xferSeconds.WithLabelValues(direction).Observe(d.Seconds())
}

// Swept implements executor.Observer.
func (m *Metrics) Swept(removed int, err error) {
	if m == nil {
		return
	}
	m.sweeps.Inc()
	m.swept.Add(float64(removed))
	if err != nil {
		m.sweepErrors.Inc()
	}
}

// CleanupFailed implements executor.Observer.
func (m *Metrics) CleanupFailed() {
	if m == nil {
		return
	}
	m.cleanupFailures.Inc()
}

// WarmPods implements executor.Observer.
func (m *Metrics) WarmPods(ready, starting int) {
	if m == nil {
		return
	}
	m.warmPods.WithLabelValues("ready").Set(float64(ready))
	m.warmPods.WithLabelValues("starting").Set(float64(starting))
}

// WarmTaken implements executor.Observer.
func (m *Metrics) WarmTaken() {
	if m == nil {
		return
	}
	m.warmTaken.Inc()
}

// CredentialExpiry implements executor.Observer: the scrape exports the
// seconds left until at.
func (m *Metrics) CredentialExpiry(credential string, at time.Time) {
	if m == nil {
		return
	}
	m.expiry.set(known(Credentials, credential), at)
}

// CheckWritten: a check record was written with status.
func (m *Metrics) CheckWritten(status string) {
	if m == nil {
		return
	}
	m.checkWrites.WithLabelValues(known(CheckStatuses, status)).Inc()
}

// CheckRefused: the PDS refused a check record as invalid.
func (m *Metrics) CheckRefused() {
	if m == nil {
		return
	}
	m.checkRefusals.Inc()
}

// RateLimitWaited: a write waited d for the PDS's rate limit to reset.
func (m *Metrics) RateLimitWaited(d time.Duration) {
	if m == nil {
		return
	}
	m.rateWaits.Inc()
	m.rateWaitSeconds.Add(d.Seconds())
}

// WriteBudget: the PDS said remaining write points are left in its
// window (its ratelimit-remaining header).
func (m *Metrics) WriteBudget(remaining int) {
	if m == nil {
		return
	}
	m.writeBudget.WithLabelValues().Set(float64(remaining))
}

// SetQueueDepth: n runs are queued.
func (m *Metrics) SetQueueDepth(n int) {
	if m == nil {
		return
	}
	m.queueDepth.Set(float64(n))
}

// SetRunsGoing: n runs are going.
func (m *Metrics) SetRunsGoing(n int) {
	if m == nil {
		return
	}
	m.runsGoing.Set(float64(n))
}

// SetReplicasLive: n of the runner's replicas are live.
func (m *Metrics) SetReplicasLive(n int) {
	if m == nil {
		return
	}
	m.replicas.WithLabelValues().Set(float64(n))
}

// SetOwedChecks: n final checks are owed to the PDS.
func (m *Metrics) SetOwedChecks(n int) {
	if m == nil {
		return
	}
	m.owedChecks.Set(float64(n))
}

// SetDegraded says whether the runner is degraded for reason.
func (m *Metrics) SetDegraded(reason string, degraded bool) {
	if m == nil {
		return
	}
	v := 0.0
	if degraded {
		v = 1
	}
	m.degraded.WithLabelValues(known(DegradedReasons, reason)).Set(v)
}

// Landed: the merge queue landed a batch.
func (m *Metrics) Landed() {
	if m == nil {
		return
	}
	m.landings.Inc()
}

// Deferred: an event waits for its author's caps (limit: the flag).
func (m *Metrics) Deferred(limit string) {
	if m == nil {
		return
	}
	m.deferred.WithLabelValues(known(Limits, limit)).Inc()
}

// Refused: an event got one error check instead of runs.
func (m *Metrics) Refused(reason string) {
	if m == nil {
		return
	}
	m.refused.WithLabelValues(known(RefusalReasons, reason)).Inc()
}

// TickSkipped: a schedule's tick was not run, for reason.
func (m *Metrics) TickSkipped(reason string) {
	if m == nil {
		return
	}
	m.ticksSkipped.WithLabelValues(known(TickSkipReasons, reason)).Inc()
}

// Inherited: at start, this process did how with a run an earlier one
// left going (InheritedHows).
func (m *Metrics) Inherited(how string) {
	if m == nil {
		return
	}
	m.inherited.WithLabelValues(known(InheritedHows, how)).Inc()
}

// Retried: a run was tried again by its workflow's retry, for reason
// (RetryReasons).
func (m *Metrics) Retried(reason string) {
	if m == nil {
		return
	}
	m.retries.WithLabelValues(known(RetryReasons, reason)).Inc()
}

// TakenOver: a run an earlier process left going goes on here, after
// since this process started.
func (m *Metrics) TakenOver(after time.Duration) {
	if m == nil {
		return
	}
	m.takeover.Observe(after.Seconds())
}

// FenceConflict implements executor.Observer: a create of a run's
// objects found them there (FenceExists).
func (m *Metrics) FenceConflict() {
	if m == nil {
		return
	}
	m.fence.WithLabelValues(FenceExists).Inc()
}

// SwapLost: a check write lost its compare-and-swap (FenceLostSwap).
func (m *Metrics) SwapLost() {
	if m == nil {
		return
	}
	m.fence.WithLabelValues(FenceLostSwap).Inc()
}

// Ejected: the merge queue ejected a pull for reason.
func (m *Metrics) Ejected(reason string) {
	if m == nil {
		return
	}
	m.ejections.WithLabelValues(known(EjectionReasons, reason)).Inc()
}

// expiryCollector exports each credential's seconds left, computed at
// the scrape: a value stored earlier would be stale by the time it is
// read.
type expiryCollector struct {
	desc *prometheus.Desc

	mu sync.Mutex
	at map[string]time.Time
}

func newExpiryCollector(desc *prometheus.Desc) *expiryCollector {
	return &expiryCollector{desc: desc, at: map[string]time.Time{}}
}

func (c *expiryCollector) set(credential string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.IsZero() {
		delete(c.at, credential)
		return
	}
	c.at[credential] = at
}

// Describe implements prometheus.Collector.
func (c *expiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *expiryCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for credential, at := range c.at {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, at.Sub(now).Seconds(), credential)
	}
}
