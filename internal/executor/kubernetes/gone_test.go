package kubernetes

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSessionGone(t *testing.T) {
	t.Parallel()
	now := metav1.Now()
	cond := func(typ batchv1.JobConditionType, s corev1.ConditionStatus) *batchv1.Job {
		return &batchv1.Job{Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: typ, Status: s}}}}
	}
	pod := func(phase corev1.PodPhase, deleting bool) corev1.Pod {
		p := corev1.Pod{Status: corev1.PodStatus{Phase: phase}}
		if deleting {
			p.DeletionTimestamp = &now
		}
		return p
	}
	refused := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "NodeAffinity",
		Message: "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"}}
	for _, tc := range []struct {
		name string
		job  *batchv1.Job
		pods []corev1.Pod
		want bool
	}{
		{"running", &batchv1.Job{}, []corev1.Pod{pod(corev1.PodRunning, false)}, false},
		{"no pod yet", &batchv1.Job{}, nil, false},
		{"pending pod", &batchv1.Job{}, []corev1.Pod{pod(corev1.PodPending, false)}, false},
		{"job being deleted", &batchv1.Job{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, []corev1.Pod{pod(corev1.PodRunning, false)}, true},
		{"job failed", cond(batchv1.JobFailed, corev1.ConditionTrue), nil, true},
		{"job complete", cond(batchv1.JobComplete, corev1.ConditionTrue), nil, true},
		{"condition not true", cond(batchv1.JobFailed, corev1.ConditionFalse), []corev1.Pod{pod(corev1.PodRunning, false)}, false},
		{"pod failed", &batchv1.Job{}, []corev1.Pod{pod(corev1.PodFailed, false)}, true},
		{"pod being deleted", &batchv1.Job{}, []corev1.Pod{pod(corev1.PodRunning, true)}, true},
		{"one pod of two goes on", &batchv1.Job{}, []corev1.Pod{pod(corev1.PodFailed, false), pod(corev1.PodRunning, false)}, false},
		// The Job replaces a pod its node refused at admission.
		{"only pod refused at admission", &batchv1.Job{}, []corev1.Pod{refused}, false},
		{"refused, then one running", &batchv1.Job{}, []corev1.Pod{refused, pod(corev1.PodRunning, false)}, false},
		{"refused, then one failed", &batchv1.Job{}, []corev1.Pod{refused, pod(corev1.PodFailed, false)}, true},
		{"refused, and the job failed", cond(batchv1.JobFailed, corev1.ConditionTrue), []corev1.Pod{refused}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := sessionGone(tc.job, tc.pods); got != tc.want {
				t.Errorf("sessionGone = %v, want %v", got, tc.want)
			}
		})
	}
}
