// Package kubernetes is the default executor: each run is one Kubernetes
// Job whose single pod stays alive while the runner execs one step at a
// time into it through client-go. Steps run detached inside the pod, so a
// dropped exec stream is picked up again from a byte offset; the step's
// exit status is written to a file only when it ends.
package kubernetes

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/reaper"
	"knotless.dev/run/internal/kube/kubeclient"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/internal/lib/tarstream"
	"knotless.dev/run/internal/rules/class"
)

// Name is the executor's name.
const Name = "kubernetes"

//go:embed scripts/step.sh
var stepTool string

// stepScript is the step tool as it runs: after the reaper's functions,
// which it kills a step's leftovers with.
var stepScript = reaper.Sh + stepTool

//go:embed scripts/put.sh
var putScript string

//go:embed scripts/get.sh
var getScript string

// Config configures the Kubernetes executor.
type Config struct {
	Credentials Credentials
	// Runner is the runner's DID; its digest labels every object.
	Runner string
	Pod    PodOptions
	// ScheduleTimeout bounds how long a run waits for a node: Pending
	// because nothing fits is the cluster's scale-up signal.
	ScheduleTimeout time.Duration
	// PullGrace is how long a pull the registry denies may fail, for
	// a pod with pull secrets, before the run ends: a busy kubelet
	// pulls once before it has read them. Every other pull failure ends
	// the run at once.
	PullGrace time.Duration
	Limits    tarstream.Limits
	// QPS and Burst are the runner's own limit on its requests to the
	// API server (client-go's token bucket, shared by every request of
	// the executor): QPS requests a second on average, Burst at once.
	// 0 takes DefaultQPS and DefaultBurst.
	QPS   float32
	Burst int
	// Driver is this process's replica name when the runner runs as
	// replicas (serve --replicas): every Job it creates says so
	// (AnnotationDriver), and its sweep leaves the Jobs other replicas
	// drive alone. Empty: one process, which sweeps every Job of the
	// runner's not in hand.
	Driver string
	// DriverInvocation is this process, beside Driver
	// (AnnotationDriverInvocation).
	DriverInvocation string
	Logger           *slog.Logger
	// Observer is told of sessions ready, transfers, sweeps, cleanup
	// failures and the credential's expiry; nil observes nothing.
	Observer executor.Observer
}

// Executor runs sessions as Jobs.
type Executor struct {
	cfg     Config
	clients *clients
	log     *slog.Logger
	obs     executor.Observer

	warm *warmPool

	swept           atomic.Int64
	cleanupFailures atomic.Int64
	warmStarts      atomic.Int64
}

// Counters are the executor's running totals since it was made.
type Counters struct {
	Swept           int64 // Jobs of earlier processes deleted by Sweep
	CleanupFailures int64 // Jobs a run (or the warm pool) could not delete
	WarmStarts      int64 // runs started on a warm pod
}

// Counters returns the running totals.
func (e *Executor) Counters() Counters {
	return Counters{Swept: e.swept.Load(), CleanupFailures: e.cleanupFailures.Load(), WarmStarts: e.warmStarts.Load()}
}

// New returns a Kubernetes executor. It checks that credentials can be
// loaded, so a missing or broken configuration fails at start.
func New(cfg Config) (*Executor, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ScheduleTimeout == 0 {
		cfg.ScheduleTimeout = 10 * time.Minute
	}
	if cfg.PullGrace == 0 {
		cfg.PullGrace = 20 * time.Second
	}
	if cfg.Observer == nil {
		cfg.Observer = executor.NoObserver{}
	}
	if cfg.QPS == 0 {
		cfg.QPS = DefaultQPS
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Pod.DefaultClass.Name == "" {
		// The engine's default class when the operator defines none.
		cfg.Pod.DefaultClass, _ = class.Set{}.Pick("", true)
	}
	e := &Executor{cfg: cfg, clients: &clients{creds: cfg.Credentials, qps: cfg.QPS, burst: cfg.Burst, log: cfg.Logger, obs: cfg.Observer}, log: cfg.Logger, obs: cfg.Observer, warm: newWarmPool()}
	// An expired token is not a start failure: each run reports it until
	// the refresh replaces the file.
	cc, _, ns, err := e.clients.load()
	if err != nil {
		return nil, err
	}
	e.log.Info("cluster credentials loaded", "server", cc.Host, "namespace", ns,
		"egress", cfg.Pod.Egress.For(true), "egress_untrusted", cfg.Pod.Egress.For(false))
	exp, err := kubecred.CheckExpiry(cc, time.Now())
	if err != nil {
		e.log.Error("runner credentials expired", "expires", exp.Format(time.RFC3339))
	}
	e.clients.observeExpiry(exp)
	return e, nil
}

// Name implements executor.Executor.
func (e *Executor) Name() string { return Name }

// Namespace is the namespace runs go to with the current credentials.
func (e *Executor) Namespace() (string, error) {
	_, _, ns, err := e.clients.get()
	return ns, err
}

// API returns the clientset and namespace of the current credentials
// (refreshed as the kubeconfig file is replaced): the replicas' Leases
// go through it, under the executor's own rate limit.
func (e *Executor) API() (*kubeclient.Clientset, string, error) {
	_, cs, ns, err := e.clients.get()
	return cs, ns, err
}

// Start takes a warm Job whose pod is the run's (warm.go), else creates
// the run's Job and waits until its pod is Ready. Its log lines, and the
// session's, name the run, the Job, its namespace and image, and once it
// is Ready its pod and node.
func (e *Executor) Start(ctx context.Context, spec executor.Spec) (executor.Session, error) {
	cc, cs, ns, err := e.clients.get()
	if err != nil {
		return nil, err
	}
	if spec.Runner == "" {
		spec.Runner = e.cfg.Runner
	}
	if err := e.ensureNetworkPolicies(ctx, cc.Host, cs, ns, spec.Runner, e.cfg.Pod.Egress.For(spec.Trusted)); err != nil {
		return nil, err
	}
	job, err := BuildJob(ns, spec, e.cfg.Pod)
	if err != nil {
		return nil, fmt.Errorf("build job: %w", err)
	}
	if s := e.startWarm(ctx, spec, job); s != nil {
		return s, nil
	}
	if e.cfg.Driver != "" {
		job.Annotations[AnnotationDriver] = e.cfg.Driver
		job.Annotations[AnnotationDriverInvocation] = e.cfg.DriverInvocation
	}
	log := e.log.With("run", spec.RunID, "job", job.Name, "namespace", ns, "image", jobImage(job))
	created, err := e.createJob(ctx, cs, job, log)
	if err != nil {
		return nil, err
	}
	createdAt := time.Now()
	log.Info("job created")
	s := e.newSession(spec, created, log)
	// The Job's create is the fence; its budget follows at once, before
	// its pod can have started a step.
	if err := createBudget(ctx, cs, created, spec.RunID, true); err != nil {
		s.cleanupAfterFailedStart(ctx)
		return nil, err
	}
	// A run that waits for a node takes it back from the warm pods.
	var held func()
	pod, err := e.waitForPod(ctx, cs, created, log, func() {
		if held == nil {
			held = e.holdForRun()
		}
		e.yieldToRun()
	})
	if held != nil {
		held()
	}
	if err != nil {
		s.cleanupAfterFailedStart(ctx)
		return nil, err
	}
	e.obs.SessionReady(time.Since(createdAt))
	s.setPod(pod)
	return s, nil
}

// newSession is spec's run's session in its Job job, as created or
// taken.
func (e *Executor) newSession(spec executor.Spec, job *batchv1.Job, log *slog.Logger) *Session {
	return &Session{
		ex:   e,
		ref:  executor.Ref{Executor: Name, RunID: spec.RunID, Namespace: job.Namespace, Name: job.Name},
		keep: spec.Keep,
		uid:  job.UID,
		log:  log,
		// From the Job, as Resume reads it.
		stepContainers: parseStepContainers(job.Annotations[AnnotationStepContainers]),
	}
}

// Resume takes over a session from its Ref: the Job and pod must still
// be there.
func (e *Executor) Resume(ctx context.Context, ref executor.Ref) (executor.Session, error) {
	_, cs, _, err := e.clients.get()
	if err != nil {
		return nil, err
	}
	job, err := cs.BatchV1().Jobs(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("resume job %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	log := e.log.With("run", ref.RunID, "job", ref.Name, "namespace", ref.Namespace, "image", jobImage(job))
	s := &Session{ex: e, ref: ref, uid: job.UID, log: log, stepContainers: parseStepContainers(job.Annotations[AnnotationStepContainers])}
	// The process that made the Job made its budget, unless it died
	// between the two.
	if err := createBudget(ctx, cs, job, ref.RunID, false); err != nil {
		return nil, fmt.Errorf("resume job %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	pod, err := e.waitForPod(ctx, cs, job, log, nil)
	if err != nil {
		return nil, err
	}
	s.setPod(pod)
	return s, nil
}

// jobImage is the image of a Job's run container.
func jobImage(job *batchv1.Job) string {
	for _, c := range job.Spec.Template.Spec.Containers {
		if c.Name == containerName {
			return c.Image
		}
	}
	return ""
}

// ensureNetworkPolicies makes the runner's policies in ns what this
// executor wants for a run of egress mode mode, before every run: never
// trusted from an earlier run or from their names alone. The ingress
// policy selects every pod of the runner; the mode's egress policy (none
// for open) its pods of that mode. The block list (the API server's
// addresses among it) is read again for each run.
func (e *Executor) ensureNetworkPolicies(ctx context.Context, apiServer string, cs *kubeclient.Clientset, ns, runner string, mode EgressMode) error {
	policies := []*networkingv1.NetworkPolicy{BuildNetworkPolicy(ns, runner)}
	if mode.limitsEgress() {
		var block []netip.Prefix
		if mode.blocks() {
			var err error
			if block, err = DefaultEgressBlock(ctx, apiServer, e.cfg.Pod.Egress.Block); err != nil {
				return err
			}
		}
		policies = append(policies, BuildEgressPolicy(ns, runner, mode, block))
	}
	for _, np := range policies {
		did, err := ensureNetworkPolicy(ctx, cs, np)
		if err != nil {
			return err
		}
		switch did {
		case "created":
			e.log.Info("network policy created", "namespace", ns, "name", np.Name, "egress", mode)
		case "replaced":
			e.log.Warn("network policy differed from the runner's: replaced", "namespace", ns, "name", np.Name, "egress", mode)
		}
	}
	return nil
}

// Sweep deletes this runner's Jobs whose run is not in keep, and its
// warm Jobs that this process did not make; as a replica (Driver), not
// those another replica drives. It logs
// each Job it deletes (run, Job, namespace, image) and what it did in
// all, with the running totals of this process.
func (e *Executor) Sweep(ctx context.Context, keep []string) (swept []executor.Ref, err error) {
	start := time.Now()
	defer func() { e.obs.Swept(len(swept), err) }()
	_, cs, ns, err := e.clients.get()
	if err != nil {
		return nil, err
	}
	sel := labels.SelectorFromSet(labels.Set{LabelRunner: RunnerLabel(e.cfg.Runner)}).String()
	jobs, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list jobs in %s: %w", ns, err)
	}
	going := map[string]bool{}
	for _, id := range keep {
		going[id] = true
	}
	if e.cfg.Driver != "" {
		// Another replica's runs are that replica's: it takes them up
		// when it comes back under its name.
		for i := range jobs.Items {
			if d := jobs.Items[i].Annotations[AnnotationDriver]; d != "" && d != e.cfg.Driver {
				going[jobs.Items[i].Labels[LabelRun]] = true
			}
		}
	}
	var errs []error
	for i := range jobs.Items {
		job := &jobs.Items[i]
		run := job.Labels[LabelRun]
		if going[run] || (run == "" && e.warm.owns(job.Name)) {
			continue
		}
		ref := executor.Ref{Executor: Name, RunID: run, Namespace: ns, Name: job.Name}
		if err := deleteJob(ctx, cs.BatchV1().Jobs(ns), job.Name, job.UID); err != nil {
			e.cleanupFailures.Add(1)
			e.obs.CleanupFailed()
			e.log.Error("orphan not swept", "job", job.Name, "run", run, "namespace", ns, "image", jobImage(job),
				"err", err, "cleanup_failures_total", e.cleanupFailures.Load())
			errs = append(errs, err)
			continue
		}
		e.swept.Add(1)
		e.log.Info("orphan swept", "job", job.Name, "run", run, "namespace", ns, "image", jobImage(job), "swept_total", e.swept.Load())
		swept = append(swept, ref)
	}
	errs = append(errs, e.sweepBudgets(ctx, cs, ns, sel, going)...)
	e.log.Info("sweep finished", "namespace", ns, "swept", len(swept), "failed", len(errs), "kept_runs", len(keep),
		"duration", time.Since(start).Round(time.Millisecond),
		"swept_total", e.swept.Load(), "cleanup_failures_total", e.cleanupFailures.Load())
	return swept, errors.Join(errs...)
}

// sweepBudgets deletes the runner's disruption budgets (sel) whose run
// is not going: each is owned by its Job and collected with it, so one
// is left only when its Job went a moment ago (or lost its owner).
func (e *Executor) sweepBudgets(ctx context.Context, cs *kubeclient.Clientset, ns, sel string, going map[string]bool) []error {
	budgets, err := cs.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if apierrors.IsForbidden(err) {
		return []error{fmt.Errorf("list pod disruption budgets in %s: RBAC denies it (the runner's Role needs list on poddisruptionbudgets of the policy group; mint the kubeconfig again with knotless-run kubeconfig): %w", ns, err)}
	}
	if err != nil {
		return []error{fmt.Errorf("list pod disruption budgets in %s: %w", ns, err)}
	}
	var errs []error
	for i := range budgets.Items {
		pdb := &budgets.Items[i]
		run := pdb.Labels[LabelRun]
		if going[run] {
			continue
		}
		if err := deleteBudget(ctx, cs, ns, pdb.Name); err != nil {
			e.cleanupFailures.Add(1)
			e.obs.CleanupFailed()
			e.log.Error("orphan budget not swept", "budget", pdb.Name, "run", run, "namespace", ns, "err", err, "cleanup_failures_total", e.cleanupFailures.Load())
			errs = append(errs, err)
			continue
		}
		e.log.Info("orphan budget swept", "budget", pdb.Name, "run", run, "namespace", ns)
	}
	return errs
}

type jobDeleter interface {
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// deleteJob deletes the Job name, only if it is still the one of uid
// (when uid is set): a run's Job is named from the run (the fence), so
// a later Job of the same run may have its name by now; that one is
// not this caller's to delete, and the one it meant is gone.
func deleteJob(ctx context.Context, jobs jobDeleter, name string, uid types.UID) error {
	opts := metav1.DeleteOptions{PropagationPolicy: ptrTo(metav1.DeletePropagationBackground)}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := jobs.Delete(ctx, name, opts)
	if err != nil && !apierrors.IsNotFound(err) && !(uid != "" && apierrors.IsConflict(err)) {
		return fmt.Errorf("delete job %s: %w", name, err)
	}
	return nil
}

// podsOfJob selects the pods of the Job of uid: by the Job controller's
// label of its UID, not of its name, which a later Job of the same run
// shares.
func podsOfJob(uid types.UID) metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: batchv1.ControllerUidLabel + "=" + string(uid)}
}

func ptrTo[T any](v T) *T { return &v }

var (
	_ executor.Resumer  = (*Executor)(nil)
	_ executor.Releaser = (*Session)(nil)
)
