package replicas

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubeclient"
)

// maxCheckpoint bounds a run's checkpoint as kept in the cluster,
// compressed: a ConfigMap holds at most 1 MiB.
const maxCheckpoint = 900 << 10

// checkpointKey is the run's checkpoint in its ConfigMap's binaryData:
// gzip of the scheduler's checkpoint (one line of JSON, then the log).
const checkpointKey = "checkpoint.gz"

// Runs is where a replica keeps what a survivor needs of the runs it
// drives, beside each run's Job: the run's checkpoint (where it stands
// at its newest step boundary, and its log so far) in a ConfigMap the
// Job owns, so that it goes with the Job. And it is how a survivor
// claims the run of a dead replica: a conditional update of the Job's
// driver (its resourceVersion), which one claimant alone wins.
type Runs struct {
	set *Set
	// Invocation is this process, written beside the replica's name
	// on each Job it claims.
	invocation string

	mu   sync.Mutex
	uids map[string]types.UID // run: its Job's, as read for its first checkpoint
}

// NewRuns returns the run records of the replicas of set.
func NewRuns(set *Set) *Runs {
	return &Runs{set: set, invocation: set.cfg.Invocation, uids: map[string]types.UID{}}
}

func checkpointName(runID string) string { return kubernetes.JobName(runID) + "-checkpoint" }

// Save replaces run runID's checkpoint in the cluster. The ConfigMap is
// owned by the run's Job (read once, for its UID): the garbage
// collector removes it with the Job.
func (r *Runs) Save(ctx context.Context, runID string, checkpoint []byte) error {
	cs, ns, err := r.set.cfg.API()
	if err != nil {
		return err
	}
	data, err := compress(checkpoint)
	if err != nil {
		return err
	}
	if len(data) > maxCheckpoint {
		return fmt.Errorf("checkpoint of run %s is %d bytes compressed, over the %d a ConfigMap holds", runID, len(data), maxCheckpoint)
	}
	cms := cs.CoreV1().ConfigMaps(ns)
	name := checkpointName(runID)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		cm.BinaryData = map[string][]byte{checkpointKey: data}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("save the checkpoint of run %s in %s/%s: %w", runID, ns, name, err)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("read the checkpoint of run %s in %s/%s: %w", runID, ns, name, err)
	}
	uid, err := r.jobUID(ctx, cs, ns, runID)
	if err != nil {
		return err
	}
	cm = &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:          map[string]string{executor.LabelRunner: executor.RunnerLabel(r.set.cfg.Runner), executor.LabelRun: runID},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: kubernetes.JobName(runID), UID: uid}}},
		BinaryData: map[string][]byte{checkpointKey: data},
	}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("save the checkpoint of run %s in %s/%s: %w", runID, ns, name, err)
	}
	return nil
}

func (r *Runs) jobUID(ctx context.Context, cs *kubeclient.Clientset, ns, runID string) (types.UID, error) {
	r.mu.Lock()
	uid, ok := r.uids[runID]
	r.mu.Unlock()
	if ok {
		return uid, nil
	}
	job, err := cs.BatchV1().Jobs(ns).Get(ctx, kubernetes.JobName(runID), metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the Job of run %s: %w", runID, err)
	}
	r.mu.Lock()
	r.uids[runID] = job.UID
	r.mu.Unlock()
	return job.UID, nil
}

// Forget drops what Save remembered of a run that ended.
func (r *Runs) Forget(runID string) {
	r.mu.Lock()
	delete(r.uids, runID)
	r.mu.Unlock()
}

// Claim is asked by a replica whose start of run runID met the run's
// Job (the fence). When the Job's driver is this process, or a replica
// not alive, it takes the run: the Job's driver becomes this process,
// by an update that fails if anyone changed the Job since it was read.
// It returns claimed false when the driver lives (or another claimant
// won): the run is the driver's; an error wrapping
// executor.ErrSessionGone when the Job is not there (or being deleted).
// Claimed, it returns the run's
// checkpoint, or nil when the dead driver recorded none (no step had
// started): the claimant then queues the run's check again and deletes
// the Job (Drop), so that the run starts again. Until the check says
// queued, the Job stays: a check that says running has its Job, for
// the next claimant if this one dies too.
// lastSeen is when the dead driver last renewed its Lease, as this
// replica saw it (zero: unknown, or this replica's earlier process).
func (r *Runs) Claim(ctx context.Context, runID string) (checkpoint []byte, claimed bool, lastSeen time.Time, err error) {
	cs, ns, err := r.set.cfg.API()
	if err != nil {
		return nil, false, time.Time{}, err
	}
	jobs := cs.BatchV1().Jobs(ns)
	name := kubernetes.JobName(runID)
	// A conflict on the claim is another writer of the Job since it was
	// read: another claimant (read again, it is the driver and lives)
	// or the Job controller's status update (read again, nothing
	// changed for the claim). So the Job is read again, a few times.
	var job *batchv1.Job
	for attempt := 1; ; attempt++ {
		job, err = jobs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, false, time.Time{}, fmt.Errorf("claim run %s: %w", runID, executor.ErrSessionGone)
		}
		if err != nil {
			return nil, false, time.Time{}, fmt.Errorf("claim run %s: read its Job: %w", runID, err)
		}
		driver, inv := job.Annotations[kubernetes.AnnotationDriver], job.Annotations[kubernetes.AnnotationDriverInvocation]
		self := r.set.Self()
		switch {
		case job.DeletionTimestamp != nil:
			return nil, false, time.Time{}, fmt.Errorf("claim run %s: its Job is being deleted: %w", runID, executor.ErrSessionGone)
		case driver == "":
			// Made by a runner process that is no replica: not this
			// replica's to take.
			return nil, false, time.Time{}, nil
		case driver == self && inv == r.invocation:
			// Already this process's.
		case driver != self && r.driverLives(ctx, cs, ns, driver, inv):
			return nil, false, time.Time{}, nil
		default:
			err := r.claim(ctx, jobs, job)
			switch {
			case apierrors.IsConflict(err) && attempt < 3:
				continue
			case apierrors.IsNotFound(err):
				return nil, false, time.Time{}, fmt.Errorf("claim run %s: %w", runID, executor.ErrSessionGone)
			case apierrors.IsConflict(err):
				return nil, false, time.Time{}, nil
			case err != nil:
				return nil, false, time.Time{}, fmt.Errorf("claim run %s from replica %s: %w", runID, driver, err)
			}
			if driver != self {
				lastSeen = r.set.LastSeen(driver)
			}
			r.set.log.Info("claimed the run of a replica that is gone", "run", runID, "from", driver, "from_invocation", inv)
		}
		break
	}
	r.mu.Lock()
	r.uids[runID] = job.UID
	r.mu.Unlock()
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, checkpointName(runID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, true, lastSeen, nil // no step had started: Drop, once its check is queued
	}
	if err != nil {
		return nil, true, lastSeen, fmt.Errorf("claim run %s: read its checkpoint: %w", runID, err)
	}
	checkpoint, err = decompress(cm.BinaryData[checkpointKey])
	if err != nil {
		return nil, true, lastSeen, fmt.Errorf("claim run %s: checkpoint %s/%s: %w", runID, ns, cm.Name, err)
	}
	return checkpoint, true, lastSeen, nil
}

// Drop deletes the Job of run runID, which this process claimed with no
// checkpoint (no step had started), once the run's check is queued
// again: the run starts again from its start. A Job gone already is
// dropped.
func (r *Runs) Drop(ctx context.Context, runID string) error {
	cs, ns, err := r.set.cfg.API()
	if err != nil {
		return err
	}
	r.mu.Lock()
	uid, ok := r.uids[runID]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("drop run %s: not claimed by this process", runID)
	}
	// The UID precondition: only the Job claimed, never a Job the run's
	// next start made meanwhile.
	err = cs.BatchV1().Jobs(ns).Delete(ctx, kubernetes.JobName(runID), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid},
		PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("drop run %s: delete its Job, which started no step: %w", runID, err)
	}
	r.Forget(runID)
	return nil
}

// driverLives reads the driver's Lease afresh (this replica's view of
// the others may be a renewal old): the driving process lives while
// its replica's Lease is within its duration and held by that process.
// A Lease its replica's next process holds means the driving process
// died. A Lease that cannot be read counts as alive: nothing is
// claimed on a guess.
func (r *Runs) driverLives(ctx context.Context, cs *kubeclient.Clientset, ns, driver, inv string) bool {
	l, err := cs.CoordinationV1().Leases(ns).Get(ctx, LeaseName(r.set.cfg.Runner, driver), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false
	case err != nil:
		r.set.log.Warn("cannot read the Lease of a run's driver; the run is left to it", "driver", driver, "err", err)
		return true
	}
	return live(l, time.Now()) && (inv == "" || l.Annotations[AnnotationInvocation] == inv)
}

// claim makes this process job's driver, if job is as read.
func (r *Runs) claim(ctx context.Context, jobs jobPatcher, job *batchv1.Job) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		// The resourceVersion makes the patch conditional: it fails
		// with a conflict if the Job changed since it was read.
		"resourceVersion": job.ResourceVersion,
		"annotations": map[string]string{
			kubernetes.AnnotationDriver:           r.set.Self(),
			kubernetes.AnnotationDriverInvocation: r.invocation,
		},
	}})
	if err != nil {
		return err
	}
	_, err = jobs.Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

type jobPatcher interface {
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*batchv1.Job, error)
}

func compress(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decompress reads a checkpoint back, bounded: a run log is capped at
// 1 MiB, and its checkpoint's line of JSON is small.
func decompress(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, errors.New("empty")
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	const limit = 4 << 20
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, err
	}
	if len(out) > limit {
		return nil, fmt.Errorf("over %d bytes", limit)
	}
	return out, nil
}

// Replica is a joined replica whole: its place among the runner's
// replicas and the records of the runs it drives.
type Replica struct {
	*Set
	*Runs
}

// Both returns set with its run records.
func Both(set *Set) Replica { return Replica{Set: set, Runs: NewRuns(set)} }
