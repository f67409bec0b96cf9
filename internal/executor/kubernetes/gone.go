package kubernetes

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor"
)

// Gone reports whether the session ref names can no longer go on: its
// Job is deleted or being deleted, has ended, or its pod has ended. A
// successor does not adopt such a run (Resume would fail or wait for a
// pod that never comes); it sweeps the session and runs the work again.
// An error means the cluster did not say; the caller decides.
func (e *Executor) Gone(ctx context.Context, ref executor.Ref) (bool, error) {
	_, cs, _, err := e.clients.get()
	if err != nil {
		return false, err
	}
	job, err := cs.BatchV1().Jobs(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get job %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	pods, err := cs.CoreV1().Pods(ref.Namespace).List(ctx, podsOfJob(job.UID))
	if err != nil {
		return false, fmt.Errorf("list pods of job %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return sessionGone(job, pods.Items), nil
}

// StopSession implements executor.Stopper: it deletes the Job ref
// names, if it is this runner's, and returns once its pods are gone. A
// Job that is gone already is no error.
func (e *Executor) StopSession(ctx context.Context, ref executor.Ref) error {
	_, cs, _, err := e.clients.get()
	if err != nil {
		return err
	}
	job, err := cs.BatchV1().Jobs(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get job %s/%s: %w", ref.Namespace, ref.Name, err)
	case job.Labels[LabelRunner] != RunnerLabel(e.cfg.Runner):
		return fmt.Errorf("job %s/%s is not this runner's (label %s=%q)", ref.Namespace, ref.Name, LabelRunner, job.Labels[LabelRunner])
	}
	s := &Session{ex: e, ref: ref, uid: job.UID, log: e.log.With("run", ref.RunID, "job", ref.Name, "namespace", ref.Namespace, "image", jobImage(job))}
	return s.deleteJob(ctx)
}

// sessionGone is Gone's rule on what the cluster holds: the Job is
// being deleted or has a final condition, or it has pods and every one
// of them has ended or is being deleted. A Job without a pod yet is not
// gone: its controller may still be making it; nor is one whose only
// pods its nodes refused at admission, which it replaces.
func sessionGone(job *batchv1.Job, pods []corev1.Pod) bool {
	if job.DeletionTimestamp != nil {
		return true
	}
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete, batchv1.JobFailed, batchv1.JobFailureTarget, batchv1.JobSuccessCriteriaMet:
			return true
		}
	}
	live := 0
	for i := range pods {
		p := &pods[i]
		if admissionRefused(p) {
			continue // the Job makes another
		}
		live++
		ended := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if !ended && p.DeletionTimestamp == nil {
			return false
		}
	}
	return live > 0
}
