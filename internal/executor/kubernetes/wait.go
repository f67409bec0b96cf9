package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeclient"
)

// noPodTimeout is how long a Job may exist without a pod before the run
// ends: quota or admission refusals show up as events on the Job.
const noPodTimeout = 30 * time.Second

// fatalWaiting reports container waiting reasons that never resolve by
// waiting.
func fatalWaiting(reason string) bool {
	switch reason {
	case "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "ErrImageNeverPull":
		return true
	}
	return false
}

// pullDenied reports a pull error in which the registry refused the
// credentials (or their absence): waiting never changes that, as the
// pod's pull secrets are fixed. containerd says "401 Unauthorized" or
// "403 Forbidden"; registries add "unauthorized" or "denied" codes.
func pullDenied(msg string) bool {
	m := strings.ToLower(msg)
	for _, s := range []string{"401 unauthorized", "403 forbidden", "unauthorized:", "denied:", "authorization failed"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// mayPullWithSecrets reports a pull failure that the retry may mend: a
// denial (or the back-off after one) of a pod with pull secrets, which
// a busy kubelet whose secret cache has not synced pulls once without
// them. Every other pull failure is final at once.
func mayPullWithSecrets(pod *corev1.Pod, wt *corev1.ContainerStateWaiting) bool {
	if len(pod.Spec.ImagePullSecrets) == 0 {
		return false
	}
	return pullDenied(wt.Message) || wt.Reason == "ImagePullBackOff"
}

// podWaiter follows a Job's pod through a watch until it is Ready.
type podWaiter struct {
	cs      *kubeclient.Clientset
	job     *batchv1.Job
	log     *slog.Logger
	grace   time.Duration
	started time.Time

	// unschedulable, if set, is called when no node takes the pod.
	unschedulable func()

	pullFailingSince time.Time
	lastReason       string
	services         serviceWait
	refused          map[string]bool // pods a node refused at admission
}

// waitForPod returns the Job's pod once it is Ready, or an error that
// says why it never will be, with the cluster's own words. unschedulable,
// if set, is called each time the scheduler finds no node for the pod.
func (e *Executor) waitForPod(ctx context.Context, cs *kubeclient.Clientset, job *batchv1.Job, log *slog.Logger, unschedulable func()) (*corev1.Pod, error) {
	return e.waitForPodWithin(ctx, cs, job, log, unschedulable, e.cfg.ScheduleTimeout, "--schedule-timeout")
}

// waitForPodWithin is waitForPod with its own timeout, which the error
// at the timeout names as what.
func (e *Executor) waitForPodWithin(ctx context.Context, cs *kubeclient.Clientset, job *batchv1.Job, log *slog.Logger, unschedulable func(), timeout time.Duration, what string) (*corev1.Pod, error) {
	w := &podWaiter{cs: cs, job: job, log: log, grace: e.cfg.PullGrace, started: time.Now(), unschedulable: unschedulable}
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pod, err := w.wait(waitCtx)
	// The wait's own deadline, not the caller's: the caller's context is
	// still live. (A clock read here could fall short of the timeout by
	// the time between making the context and reading the clock.)
	if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		reason := w.lastReason
		if reason == "" {
			reason = "no reason given"
		}
		return nil, fmt.Errorf("pod of job %s not ready after %s %s: %s", job.Name, what, timeout, reason)
	}
	return pod, err
}

func (w *podWaiter) wait(ctx context.Context) (*corev1.Pod, error) {
	sel := podsOfJob(w.job.UID)
	pods := w.cs.CoreV1().Pods(w.job.Namespace)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		list, err := pods.List(ctx, sel)
		if err != nil {
			return nil, fmt.Errorf("list pods of job %s: %w", w.job.Name, err)
		}
		for i := range list.Items {
			if pod, done, err := w.decide(ctx, &list.Items[i]); done || err != nil {
				return pod, err
			}
		}
		if err := w.checkNoPod(ctx, len(list.Items)); err != nil {
			return nil, err
		}
		opts := sel
		opts.ResourceVersion = list.ResourceVersion
		watcher, err := pods.Watch(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("watch pods of job %s: %w", w.job.Name, err)
		}
		pod, done, err := w.follow(ctx, watcher, tick, len(list.Items))
		watcher.Stop()
		if done || err != nil {
			return pod, err
		}
		// The watch ended (server timeout or restart): list again.
	}
}

// follow reads watch events until the pod is Ready, fails, or the watch
// closes (done false, err nil: list and watch again).
func (w *podWaiter) follow(ctx context.Context, watcher watch.Interface, tick *time.Ticker, seen int) (*corev1.Pod, bool, error) {
	var last *corev1.Pod
	for {
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-tick.C:
			// Time-based rules: a pull that keeps failing, a Job without a pod.
			if last != nil {
				if ready, done, err := w.decide(ctx, last); done || err != nil {
					return ready, done, err
				}
			}
			if err := w.checkNoPod(ctx, seen); err != nil {
				return nil, false, err
			}
		case ev, ok := <-watcher.ResultChan():
			if !ok {
				return nil, false, nil
			}
			switch ev.Type {
			case watch.Error:
				return nil, false, nil
			case watch.Deleted:
				return nil, false, executor.Lost(fmt.Errorf("pod of job %s was deleted before it was ready", w.job.Name))
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			seen, last = seen+1, pod
			if ready, done, err := w.decide(ctx, pod); done || err != nil {
				return ready, done, err
			}
		}
	}
}

// decide is check after the run's services: one that ended or is late
// ends the wait, naming it.
func (w *podWaiter) decide(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, bool, error) {
	if err := w.services.check(ctx, w.cs, pod, time.Now()); err != nil {
		return nil, false, err
	}
	return w.check(pod)
}

// check decides on one pod: ready (returned), failed, or still waiting
// (logged).
func (w *podWaiter) check(pod *corev1.Pod) (*corev1.Pod, bool, error) {
	if admissionRefused(pod) {
		if !w.refused[pod.Name] {
			if w.refused == nil {
				w.refused = map[string]bool{}
			}
			w.refused[pod.Name] = true
			w.log.Warn("node refused the pod at admission", "pod", pod.Name, "node", pod.Spec.NodeName,
				"reason", pod.Status.Reason, "message", pod.Status.Message, "refused", len(w.refused))
		}
		if len(w.refused) > admissionRetries {
			return nil, false, executor.Lost(fmt.Errorf("nodes refused %d pods of job %s at admission; the last, %s on node %s: %s: %s",
				len(w.refused), w.job.Name, pod.Name, pod.Spec.NodeName, pod.Status.Reason, pod.Status.Message))
		}
		w.lastReason = "refused at admission: " + pod.Status.Reason + ": " + pod.Status.Message
		return nil, false, nil // the Job makes another
	}
	if why, disrupted := podDisrupted(pod); disrupted {
		// Evicted, preempted or its node lost: no step may start in it.
		return nil, false, executor.Lost(fmt.Errorf("pod %s on node %s was disrupted before the run started in it (%s)", pod.Name, pod.Spec.NodeName, why))
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		return nil, false, fmt.Errorf("pod %s ended (%s) before it was ready: %s", pod.Name, pod.Status.Phase, podEndReason(pod))
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			w.log.Info("pod ready", "pod", pod.Name, "node", pod.Spec.NodeName, "after", time.Since(w.started).Round(time.Millisecond))
			return pod, true, nil
		}
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			reason := "waiting for a node (Pending is the scale-up signal): "
			if strings.Contains(c.Message, "anti-affinity") {
				// Runs of one runner never share a node: more runs at once
				// (--concurrency) than nodes wait here.
				reason += "a node holds another run of this runner (one run per node; more runs at once than nodes): "
			}
			w.note(pod, reason+c.Message)
			if w.unschedulable != nil {
				w.unschedulable()
			}
		}
	}
	pulling := false
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			return nil, false, fmt.Errorf("container of pod %s ended before it was ready: %s (exit %d) %s", pod.Name, t.Reason, t.ExitCode, t.Message)
		}
		wt := cs.State.Waiting
		if wt == nil {
			continue
		}
		switch {
		case fatalWaiting(wt.Reason):
			return nil, false, fmt.Errorf("pod %s cannot start: %s: %s", pod.Name, wt.Reason, wt.Message)
		case (wt.Reason == "ErrImagePull" || wt.Reason == "ImagePullBackOff") && !mayPullWithSecrets(pod, wt):
			// The kubelet's first failed pull ends the run, whatever the
			// reason (not found, denied, a registry that does not answer
			// or is not there): waiting would only hide it.
			if pullDenied(wt.Message) {
				return nil, false, fmt.Errorf("pod %s cannot pull image %s: the registry denied access (%s; a registry that needs credentials needs an --image-pull-secret whose pattern matches the image, marked ,untrusted for a pull's run): %s", pod.Name, cs.Image, wt.Reason, wt.Message)
			}
			return nil, false, pullLost(wt.Message, fmt.Errorf("pod %s cannot pull image %s (%s; the node pulls it: the image must be one the cluster's nodes can pull): %s", pod.Name, cs.Image, wt.Reason, wt.Message))
		case wt.Reason == "ErrImagePull" || wt.Reason == "ImagePullBackOff":
			// With pull secrets a denial waits out the grace: the kubelet
			// pulls without them when its secret cache has not synced yet
			// (a busy node) and with them at the retry.
			pulling = true
			if w.pullFailingSince.IsZero() {
				w.pullFailingSince = time.Now()
			}
			w.note(pod, fmt.Sprintf("image pull failing: %s: %s", wt.Reason, wt.Message))
			if time.Since(w.pullFailingSince) >= w.grace {
				if pullDenied(wt.Message) {
					return nil, false, fmt.Errorf("pod %s cannot pull image %s: the registry denied access with the pull secrets %s (%s): %s", pod.Name, cs.Image, pullSecretNames(pod), wt.Reason, wt.Message)
				}
				return nil, false, fmt.Errorf("pod %s cannot pull image %s with the pull secrets %s (%s): %s", pod.Name, cs.Image, pullSecretNames(pod), wt.Reason, wt.Message)
			}
		}
	}
	if !pulling {
		w.pullFailingSince = time.Time{}
	}
	if pod.Spec.NodeName != "" && w.lastReason != "scheduled" && !pulling {
		w.lastReason = "scheduled"
		w.log.Info("pod scheduled", "pod", pod.Name, "node", pod.Spec.NodeName)
	}
	return nil, false, nil
}

// admissionRefused reports a pod its node refused before it ran any
// container (the kubelet's admission: "Pod was rejected: …"). The Job's
// pod failure policy counts such a pod against its backoff limit and
// makes another; a pod that ran, or was disrupted, fails the Job.
func admissionRefused(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodFailed || pod.Status.Reason == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return false
		}
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil {
			return false
		}
	}
	return true
}

// pullSecretNames lists the pod's image pull secrets for a message.
func pullSecretNames(pod *corev1.Pod) string {
	names := make([]string, len(pod.Spec.ImagePullSecrets))
	for i, r := range pod.Spec.ImagePullSecrets {
		names[i] = r.Name
	}
	return strings.Join(names, ", ")
}

// note logs a waiting reason once each time it changes.
func (w *podWaiter) note(pod *corev1.Pod, reason string) {
	if reason != w.lastReason {
		w.lastReason = reason
		w.log.Warn("pod not ready", "pod", pod.Name, "reason", reason)
	}
}

// checkNoPod fails a Job that has made no pod for noPodTimeout, quoting
// the Job's warning events.
func (w *podWaiter) checkNoPod(ctx context.Context, pods int) error {
	if pods > 0 || time.Since(w.started) < noPodTimeout {
		return nil
	}
	job, err := w.cs.BatchV1().Jobs(w.job.Namespace).Get(ctx, w.job.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("job %s made no pod in %s, and reading it failed: %w", w.job.Name, noPodTimeout, err)
	}
	events, _ := w.cs.CoreV1().Events(w.job.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": job.Name, "involvedObject.kind": "Job"}.String(),
	})
	var msgs []string
	if events != nil {
		sort.Slice(events.Items, func(i, j int) bool { return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp) })
		for _, ev := range events.Items {
			if ev.Type == corev1.EventTypeWarning {
				msgs = append(msgs, ev.Reason+": "+ev.Message)
			}
		}
	}
	for _, c := range job.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			msgs = append(msgs, string(c.Type)+": "+c.Message)
		}
	}
	if len(msgs) == 0 {
		msgs = []string{"no event explains it"}
	}
	return fmt.Errorf("job %s made no pod in %s: %s", job.Name, noPodTimeout, strings.Join(msgs, "; "))
}

func podEndReason(pod *corev1.Pod) string {
	parts := []string{pod.Status.Reason, pod.Status.Message}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			parts = append(parts, fmt.Sprintf("%s exit %d %s", t.Reason, t.ExitCode, t.Message))
		}
	}
	return strings.TrimSpace(strings.Join(parts, " "))
}
