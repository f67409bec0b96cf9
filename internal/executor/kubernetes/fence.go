package kubernetes

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeclient"
)

// goneWait bounds how long createJob waits for an earlier Job of the
// same name to be deleted (a sweep's, or a released run's, in
// progress) before it calls the run fenced.
const goneWait = 2 * time.Minute

// createJob creates the run's Job. Its name is the run's (JobName of
// run.IDFor's id), so a second create of the same run fails with
// AlreadyExists: the fence. A Job of that name that is being deleted
// (a run released by a stopping runner, a sweep's orphan) is waited
// out and the create tried again; one that lives is another driver's,
// and the error wraps executor.ErrRunExists.
func (e *Executor) createJob(ctx context.Context, cs *kubeclient.Clientset, job *batchv1.Job, log *slog.Logger) (*batchv1.Job, error) {
	jobs := cs.BatchV1().Jobs(job.Namespace)
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("create job %s/%s: %w", job.Namespace, job.Name, err)
		}
		// Once sent, the create is seen through: a caller's cancel
		// (a superseded run) that cut it short could lose the answer
		// of a Job the API server made, which nothing would delete
		// and whose pod would hold its node. Made, it is deleted by
		// the failed start that follows.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createWait)
		created, err := jobs.Create(cctx, job, metav1.CreateOptions{})
		cancel()
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create job %s/%s: %w", job.Namespace, job.Name, err)
		}
		e.obs.FenceConflict()
		old, gerr := jobs.Get(ctx, job.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			continue // deleted since: create again
		case gerr != nil:
			return nil, fmt.Errorf("create job %s/%s: it exists, and reading it failed: %w", job.Namespace, job.Name, gerr)
		case old.DeletionTimestamp == nil:
			log.Warn("the run's Job exists already: another process drives this run; not run twice", "created", old.CreationTimestamp.Time, "uid", old.UID)
			return nil, fmt.Errorf("create job %s/%s: %w (created %s, uid %s)", job.Namespace, job.Name, executor.ErrRunExists, old.CreationTimestamp.UTC().Format(time.RFC3339), old.UID)
		}
		log.Info("an earlier Job of this run is being deleted; waiting for it to go", "uid", old.UID)
		if err := e.waitJobGone(ctx, cs, old); err != nil {
			return nil, fmt.Errorf("create job %s/%s: an earlier Job of the run (uid %s) is being deleted and did not go: %w", job.Namespace, job.Name, old.UID, err)
		}
	}
}

// createWait bounds a Job's create, which the caller's cancel does not
// cut short.
const createWait = 30 * time.Second

// waitJobGone waits until Job old (that uid) is gone, at most goneWait.
func (e *Executor) waitJobGone(ctx context.Context, cs *kubeclient.Clientset, old *batchv1.Job) error {
	ctx, cancel := context.WithTimeout(ctx, goneWait)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		j, err := cs.BatchV1().Jobs(old.Namespace).Get(ctx, old.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, nil // the API server may be restarting: ask again
		}
		return j.UID != old.UID, nil
	})
}
