package kubernetes

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"knotless.dev/run/internal/kube/kubeclient"
)

// A run's pod is never evicted voluntarily while the run holds it: a
// node drain, the cluster autoscaler's scale-down or Karpenter's
// consolidation evict through the Eviction API, which refuses what a
// PodDisruptionBudget forbids. Each run has one, made with its Job (or
// when it takes a warm Job) and deleted at its end.

// AnnotationSafeToEvict is the cluster autoscaler's annotation on a pod:
// "false" keeps the pod's node from a scale-down, "true" lets it go
// though the pod has local storage (the run's emptyDirs), which would
// otherwise keep the node too.
const AnnotationSafeToEvict = "cluster-autoscaler.kubernetes.io/safe-to-evict"

// labelJobName is the label the Job controller puts on a Job's pods.
const labelJobName = "batch.kubernetes.io/job-name"

// BuildDisruptionBudget returns the PodDisruptionBudget of the run runID
// whose Job is job: named after the Job, labelled with the runner and
// the run, wanting its one pod available (minAvailable 1: the
// disruption controller reads maxUnavailable through the controller's
// scale subresource, which a Job has not, and then allows nothing and
// refuses nothing for the count: "jobs.batch does not implement the
// scale subresource"), and selecting
// the Job's pods (and no other: the Job's name is unique in its
// namespace, and the runner's label is part of the selector). It is
// owned by the Job, so whatever deletes the Job (the runner, its TTL,
// an operator) deletes it too. It is pure.
func BuildDisruptionBudget(job *batchv1.Job, runID string) *policyv1.PodDisruptionBudget {
	one := intstr.FromInt32(1)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{
			Name:      job.Name,
			Namespace: job.Namespace,
			Labels: map[string]string{
				LabelRunner:    job.Labels[LabelRunner],
				LabelRun:       runID,
				LabelManagedBy: managedByValue,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: batchv1.SchemeGroupVersion.String(),
				Kind:       "Job",
				Name:       job.Name,
				UID:        job.UID,
			}},
		},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{
				labelJobName: job.Name,
				LabelRunner:  job.Labels[LabelRunner],
			}},
		},
	}
}

// createBudget makes the run's budget for its Job job. A budget of the
// Job's name that is there already belongs to an earlier Job of that
// name (the Job's create, which this follows, is the fence: no two live
// Jobs share a name), gone but not yet collected with it; it is
// replaced, unless replace is false (Resume: the process that made this
// Job made it).
func createBudget(ctx context.Context, cs *kubeclient.Clientset, job *batchv1.Job, runID string, replace bool) error {
	pdb := BuildDisruptionBudget(job, runID)
	budgets := cs.PolicyV1().PodDisruptionBudgets(job.Namespace)
	_, err := budgets.Create(ctx, pdb, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		if !replace {
			return nil
		}
		if err := budgets.Delete(ctx, pdb.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return budgetError("delete", pdb, err)
		}
		_, err = budgets.Create(ctx, pdb, metav1.CreateOptions{})
	}
	if err != nil {
		return budgetError("create", pdb, err)
	}
	return nil
}

// budgetError names the budget, and the Role's missing verb when RBAC
// refused.
func budgetError(verb string, pdb *policyv1.PodDisruptionBudget, err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%s pod disruption budget %s/%s: RBAC denies it (the runner's Role needs %s on poddisruptionbudgets of the policy group; mint the kubeconfig again with knotless-run kubeconfig): %w",
			verb, pdb.Namespace, pdb.Name, verb, err)
	}
	return fmt.Errorf("%s pod disruption budget %s/%s: %w", verb, pdb.Namespace, pdb.Name, err)
}

// deleteBudget deletes the budget of the Job named job; one that is gone
// already is no error.
func deleteBudget(ctx context.Context, cs *kubeclient.Clientset, namespace, job string) error {
	err := cs.PolicyV1().PodDisruptionBudgets(namespace).Delete(ctx, job, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod disruption budget %s/%s: %w", namespace, job, err)
	}
	return nil
}
