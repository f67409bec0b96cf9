package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/backoff"
)

// Warm pods (serve --warm-pods N) are Jobs made ahead of runs, each with
// the pod a trusted run of the default image gets. A run whose Job would
// be the same but for its name, run label, annotations and deadline
// takes one: the Job is labelled with the run and is that run's from
// then on, deleted at its end like any other, and the pool makes
// another. A warm pod serves one run, never two. It holds a node as a
// run does (one run per node); a run that waits for a node takes that
// back: the pool gives up a warm pod and makes none while a run waits.

const (
	// LabelWarm marks a warm Job (and its pod) that no run has taken.
	LabelWarm  = "dev.knotless.warm"
	warmPrefix = jobNamePrefix + "warm-"
	// warmMaxAge is how long a warm pod waits for a run before the pool
	// replaces it, so that a warm pod is never far older than a run's.
	warmMaxAge = time.Hour
	// warmDeleteTimeout bounds deleting a warm Job that no run took.
	warmDeleteTimeout = 30 * time.Second
)

// warmRetry spaces the pool's attempts after a warm pod failed to start
// (an image that does not pull, a cluster that does not answer).
var warmRetry = backoff.Policy{First: 5 * time.Second, Max: 5 * time.Minute}

// warmPool is the executor's warm Jobs. Everything is under mu.
type warmPool struct {
	mu      sync.Mutex
	ready   []*warmJob          // Ready and not taken, oldest first
	pending map[string]*warmJob // made, not Ready yet
	// made is every warm Job this process made and has not seen deleted:
	// Sweep leaves them (one just taken may still be unlabelled in the
	// list it read).
	made map[string]bool
	// waiting counts runs waiting for a node: the pool makes no warm pod
	// while one does.
	waiting  int
	stopped  string    // why the pool keeps no more warm pods ("" while it does)
	failures int       // warm pods in a row that did not start
	retryAt  time.Time // no warm pod is made before then
	wake     chan struct{}
}

// warmJob is one warm Job as the pool made it.
type warmJob struct {
	built   *batchv1.Job // as BuildJob made it: what a run's Job is compared with
	created *batchv1.Job // as the API server returned it
	readyAt time.Time
	cancel  context.CancelFunc // ends the wait of a pending one
}

func newWarmPool() *warmPool {
	return &warmPool{pending: map[string]*warmJob{}, made: map[string]bool{}, wake: make(chan struct{}, 1)}
}

func (p *warmPool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// owns reports a warm Job this process made and has not deleted.
func (p *warmPool) owns(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.made[name]
}

// cancelPending ends the waits of the warm Jobs not Ready yet; each
// wait then deletes its Job. Under mu.
func (p *warmPool) cancelPending() {
	for _, w := range p.pending {
		w.cancel()
	}
}

// forget is told that a Job of the pool is deleted.
func (p *warmPool) forget(name string) {
	p.mu.Lock()
	delete(p.made, name)
	p.mu.Unlock()
}

// take removes and returns the oldest Ready warm Job that want's run
// can use, or nil.
func (p *warmPool) take(want *batchv1.Job) *warmJob {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, w := range p.ready {
		if fitsWarm(want, w.built) {
			p.ready = append(p.ready[:i:i], p.ready[i+1:]...)
			return w
		}
	}
	return nil
}

// fitsWarm reports whether a run whose Job is want can run in the warm
// Job warm: the same pod in every field, and the same Job but for what
// taking it sets (name, labels, annotations, active deadline).
func fitsWarm(want, warm *batchv1.Job) bool {
	if want.Labels[LabelEgress] != warm.Labels[LabelEgress] {
		return false
	}
	a, b := want.Spec.DeepCopy(), warm.Spec.DeepCopy()
	a.ActiveDeadlineSeconds, b.ActiveDeadlineSeconds = nil, nil
	a.Template.ObjectMeta, b.Template.ObjectMeta = metav1.ObjectMeta{}, metav1.ObjectMeta{}
	return apiequality.Semantic.DeepEqual(a, b)
}

// WarmPods are the warm pods of this process: Ready and not taken, and
// made but not Ready yet.
type WarmPods struct{ Ready, Starting int }

// Warm returns the warm pods of this process now.
func (e *Executor) Warm() WarmPods {
	p := e.warm
	p.mu.Lock()
	defer p.mu.Unlock()
	return WarmPods{Ready: len(p.ready), Starting: len(p.pending)}
}

// warmSpec is the run a warm pod is made for: a trusted run of the
// default image in the default class, with no requests of its own and
// no cache directories.
func (e *Executor) warmSpec() executor.Spec {
	return executor.Spec{Runner: e.cfg.Runner, Trusted: true, Class: e.cfg.Pod.DefaultClass}
}

// KeepWarm implements executor.Warmer: it keeps n warm pods until ctx
// ends, then deletes those no run took. n ≤ 0 keeps none.
func (e *Executor) KeepWarm(ctx context.Context, n int) {
	if n <= 0 {
		return
	}
	p := e.warm
	var waits sync.WaitGroup
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	e.log.Info("keeping warm pods", "warm_pods", n)
	for {
		e.retireOld(ctx)
		e.refill(ctx, n, &waits)
		now := e.Warm()
		e.obs.WarmPods(now.Ready, now.Starting)
		var retry <-chan time.Time
		p.mu.Lock()
		if d := time.Until(p.retryAt); d > 0 {
			retry = time.After(d)
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			waits.Wait() // each pending one deletes its own Job
			e.deleteAllWarm()
			e.obs.WarmPods(0, 0)
			return
		case <-p.wake:
		case <-tick.C:
		case <-retry:
		}
	}
}

// refill makes warm Jobs until n are ready or pending, unless a run
// waits for a node or the last failure's back-off has not passed.
func (e *Executor) refill(ctx context.Context, n int, waits *sync.WaitGroup) {
	p := e.warm
	for ctx.Err() == nil {
		p.mu.Lock()
		short := len(p.ready)+len(p.pending) < n && p.waiting == 0 && !time.Now().Before(p.retryAt) && p.stopped == ""
		p.mu.Unlock()
		if !short {
			return
		}
		if err := e.makeWarm(ctx, waits); err != nil {
			if ctx.Err() == nil {
				e.warmFailed(err)
			}
			return
		}
	}
}

// makeWarm creates one warm Job and starts waiting for its pod.
func (e *Executor) makeWarm(ctx context.Context, waits *sync.WaitGroup) error {
	cc, cs, ns, err := e.clients.get()
	if err != nil {
		return err
	}
	spec := e.warmSpec()
	if err := e.ensureNetworkPolicies(ctx, cc.Host, cs, ns, spec.Runner, e.cfg.Pod.Egress.For(spec.Trusted)); err != nil {
		return err
	}
	built, err := BuildJob(ns, spec, e.cfg.Pod)
	if err != nil {
		return fmt.Errorf("build warm job: %w", err)
	}
	suffix := make([]byte, 5)
	_, _ = rand.Read(suffix)
	built.Name = warmPrefix + hex.EncodeToString(suffix)
	// BuildJob gives the Job and its pod one label map.
	delete(built.Labels, LabelRun)
	built.Labels[LabelWarm] = "true"
	// An idle warm pod holds no run: the autoscaler may take its node
	// (its emptyDirs would keep the node otherwise), and no budget
	// guards it. A run that takes it gets a budget (startWarm); the
	// pod's annotation stays, as the runner may not patch pods.
	built.Spec.Template.Annotations[AnnotationSafeToEvict] = "true"
	// Not cut short by the runner stopping: a Job the API server made
	// after the caller gave up would be left behind.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), warmDeleteTimeout)
	created, err := cs.BatchV1().Jobs(ns).Create(cctx, built, metav1.CreateOptions{})
	cancel()
	if err != nil {
		return fmt.Errorf("create warm job %s/%s: %w", ns, built.Name, err)
	}
	if ctx.Err() != nil {
		e.deleteWarm(created, "the runner stops")
		return ctx.Err()
	}
	log := e.log.With("job", created.Name, "namespace", ns, "image", jobImage(created))
	log.Info("warm pod made")
	wctx, cancel := context.WithCancel(ctx)
	w := &warmJob{built: built, created: created, cancel: cancel}
	p := e.warm
	p.mu.Lock()
	p.made[created.Name] = true
	p.pending[created.Name] = w
	p.mu.Unlock()
	waits.Go(func() {
		defer cancel()
		// A warm pod may wait long for a node that runs hold.
		_, err := e.waitForPodWithin(wctx, cs, created, log, nil, warmMaxAge, "a warm pod's wait of")
		p.mu.Lock()
		delete(p.pending, created.Name)
		if err == nil && p.stopped != "" {
			err = errors.New("the pool stopped")
		}
		if err == nil {
			w.readyAt = time.Now()
			p.ready = append(p.ready, w)
			p.failures = 0
		}
		p.mu.Unlock()
		if err != nil {
			if wctx.Err() == nil && p.stopped == "" {
				e.warmFailed(fmt.Errorf("warm pod of job %s: %w", created.Name, err))
			}
			e.deleteWarm(created, "not ready")
		}
		p.poke()
	})
	return nil
}

// warmFailed logs a warm pod that could not be made and backs off.
func (e *Executor) warmFailed(err error) {
	p := e.warm
	p.mu.Lock()
	p.failures++
	wait := warmRetry.After(p.failures)
	p.retryAt = time.Now().Add(wait)
	p.mu.Unlock()
	e.log.Warn("warm pod failed; tried again later", "err", err, "retry_in", wait)
}

// retireOld replaces warm pods older than warmMaxAge.
func (e *Executor) retireOld(ctx context.Context) {
	p := e.warm
	var old []*warmJob
	p.mu.Lock()
	keep := p.ready[:0]
	for _, w := range p.ready {
		if time.Since(w.readyAt) > warmMaxAge {
			old = append(old, w)
		} else {
			keep = append(keep, w)
		}
	}
	p.ready = keep
	p.mu.Unlock()
	for _, w := range old {
		if ctx.Err() == nil {
			e.deleteWarm(w.created, "older than "+warmMaxAge.String())
		}
	}
}

// deleteAllWarm deletes every warm Job no run took, when the pool stops.
func (e *Executor) deleteAllWarm() {
	p := e.warm
	p.mu.Lock()
	left := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, w := range left {
		e.deleteWarm(w.created, "the runner stops")
	}
}

// deleteWarm deletes a warm Job no run took, bounded, whatever ctx the
// caller has left; a failure leaves it to the next sweep.
func (e *Executor) deleteWarm(job *batchv1.Job, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), warmDeleteTimeout)
	defer cancel()
	_, cs, _, err := e.clients.get()
	if err == nil {
		err = deleteJob(ctx, cs.BatchV1().Jobs(job.Namespace), job.Name, job.UID)
	}
	if err != nil {
		e.cleanupFailures.Add(1)
		e.obs.CleanupFailed()
		e.log.Error("warm pod not deleted; the next sweep deletes it", "job", job.Name, "namespace", job.Namespace, "why", why, "err", err)
		return
	}
	e.warm.forget(job.Name)
	e.log.Info("warm pod deleted", "job", job.Name, "namespace", job.Namespace, "why", why)
}

// stopWarm stops the pool for good, for why: the warm pods not Ready
// yet and the Ready ones are deleted, and no more are made.
func (e *Executor) stopWarm(why string) {
	p := e.warm
	p.mu.Lock()
	first := p.stopped == ""
	p.stopped = why
	p.cancelPending()
	p.mu.Unlock()
	if first {
		e.log.Error("warm pods stopped", "why", why)
	}
	e.deleteAllWarm()
}

// holdForRun is called when a run's pod first waits for a node: the
// pool makes no warm pod until the returned func says the wait ended.
func (e *Executor) holdForRun() (done func()) {
	p := e.warm
	p.mu.Lock()
	p.waiting++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		p.waiting--
		p.mu.Unlock()
		p.poke()
	}
}

// yieldToRun is called each time a run's pod waits for a node: the
// pool deletes its warm pods not Ready yet and one Ready one.
func (e *Executor) yieldToRun() {
	p := e.warm
	p.mu.Lock()
	p.cancelPending()
	var give *warmJob
	if len(p.ready) > 0 {
		give = p.ready[0]
		p.ready = p.ready[1:]
	}
	p.mu.Unlock()
	if give != nil {
		e.deleteWarm(give.created, "a run waits for a node")
	}
}

// startWarm starts spec's run on a warm pod if one fits want, the Job
// the run would get; nil if none does or taking it failed (the run then
// makes its own Job). The warm Job is labelled with the run before
// anything of the run goes into its pod.
func (e *Executor) startWarm(ctx context.Context, spec executor.Spec, want *batchv1.Job) *Session {
	w := e.warm.take(want)
	if w == nil {
		return nil
	}
	e.warm.poke()
	start := time.Now()
	_, cs, ns, err := e.clients.get()
	if err != nil {
		e.deleteWarm(w.created, "not taken: "+err.Error())
		return nil
	}
	log := e.log.With("run", spec.RunID, "job", w.created.Name, "namespace", ns, "image", jobImage(w.created))
	deadline := int64(time.Since(w.created.CreationTimestamp.Time)/time.Second) + 1 + *want.Spec.ActiveDeadlineSeconds
	// The pod keeps its warm label (the runner may not patch pods):
	// nothing selects on it; its Job is the run's.
	jobPatch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"labels":      map[string]any{LabelRun: spec.RunID, LabelWarm: nil},
			"annotations": want.Annotations,
		},
		"spec": map[string]any{"activeDeadlineSeconds": deadline},
	})
	taken, err := cs.BatchV1().Jobs(ns).Patch(ctx, w.created.Name, types.MergePatchType, jobPatch, metav1.PatchOptions{})
	if apierrors.IsForbidden(err) {
		// Mostly a Role minted before warm pods: no run could take one.
		e.stopWarm(fmt.Sprintf("taking a warm Job was forbidden (%v): warm pods need the verb patch on jobs in the runner's Role; mint the kubeconfig again with knotless-run kubeconfig (the refresh timer does) and restart serve", err))
		e.deleteWarm(w.created, "not taken")
		return nil
	}
	if err != nil {
		log.Warn("warm pod not taken; the run makes its own", "err", err)
		e.deleteWarm(w.created, "not taken")
		return nil
	}
	s := e.newSession(spec, taken, log)
	if err := createBudget(ctx, cs, taken, spec.RunID, true); err != nil {
		log.Warn("warm pod not taken: its run gets no disruption budget; the run makes its own Job", "err", err)
		s.cleanupAfterFailedStart(ctx)
		return nil
	}
	// Its pod is listed Ready at once, unless it ended since.
	pod, err := e.waitForPod(ctx, cs, taken, log, nil)
	if err != nil {
		log.Warn("warm pod lost; the run makes its own", "err", err)
		s.cleanupAfterFailedStart(ctx)
		return nil
	}
	e.warmStarts.Add(1)
	e.obs.WarmTaken()
	e.obs.SessionReady(time.Since(start))
	s.setPod(pod)
	s.log.Info("warm pod taken", "warm_for", time.Since(w.readyAt).Round(time.Millisecond), "warm_starts_total", e.warmStarts.Load())
	return s
}

var _ executor.Warmer = (*Executor)(nil)
