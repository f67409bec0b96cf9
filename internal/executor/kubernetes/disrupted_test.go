package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor"
)

// TestPodDisrupted: the shapes in which Kubernetes says it takes a pod
// away, each with its words; a pod that merely failed or is not
// marked is not disrupted.
func TestPodDisrupted(t *testing.T) {
	t.Parallel()
	cond := func(status corev1.ConditionStatus, reason, msg string) corev1.PodCondition {
		return corev1.PodCondition{Type: corev1.DisruptionTarget, Status: status, Reason: reason, Message: msg}
	}
	for _, tt := range []struct {
		name   string
		status corev1.PodStatus
		want   string
		ok     bool
	}{
		{"eviction through the API", corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{cond(corev1.ConditionTrue, "EvictionByEvictionAPI", "Eviction API: evicting")}},
			"EvictionByEvictionAPI: Eviction API: evicting", true},
		{"node pressure, kubelet with the condition", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory.",
			Conditions: []corev1.PodCondition{cond(corev1.ConditionTrue, "TerminationByKubelet", "The node was low on resource: memory.")}},
			"TerminationByKubelet: The node was low on resource: memory.; Evicted: The node was low on resource: memory.", true},
		{"node pressure, kubelet without it", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: ephemeral-storage."},
			"Evicted: The node was low on resource: ephemeral-storage.", true},
		{"past its ephemeral-storage limit (the kubelet's words end in a space)", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "Pod ephemeral local storage usage exceeds the total limit of containers 32Mi. "},
			"Evicted: Pod ephemeral local storage usage exceeds the total limit of containers 32Mi.", true},
		{"preempted", corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{cond(corev1.ConditionTrue, "PreemptionByScheduler", "Preempted by pod x")}},
			"PreemptionByScheduler: Preempted by pod x", true},
		{"a condition without words", corev1.PodStatus{Conditions: []corev1.PodCondition{cond(corev1.ConditionTrue, "", "")}}, "DisruptionTarget", true},
		{"a condition not true", corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{cond(corev1.ConditionFalse, "EvictionByEvictionAPI", "")}}, "", false},
		{"failed, not disrupted", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "DeadlineExceeded"}, "", false},
		{"running", corev1.PodStatus{Phase: corev1.PodRunning}, "", false},
	} {
		got, ok := podDisrupted(&corev1.Pod{Status: tt.status})
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: %q, %v; want %q, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

// TestOwnLimit: the kubelet's eviction messages for a pod's own bounds
// (each as the kubelet words it) are the run's doing; node pressure is
// not.
func TestOwnLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		why  string
		want bool
	}{
		{"Evicted: Pod ephemeral local storage usage exceeds the total limit of containers 32Mi.", true},
		{`Evicted: Container run exceeded its local ephemeral storage limit "32Mi".`, true},
		{`Evicted: Usage of EmptyDir volume "work" exceeds the limit "1Gi".`, true},
		{"Evicted: The node was low on resource: ephemeral-storage.", false},
		{"Evicted: The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi. Container run was using 2Gi, request is 0, has larger consumption of memory.", false},
	} {
		if got := ownLimit(tt.why); got != tt.want {
			t.Errorf("ownLimit(%q) = %v, want %v", tt.why, got, tt.want)
		}
	}
}

// TestPodEndedEvictedByItsOwnLimit: a pod whose Failed/Evicted status
// reached the API server (the kubelet's status is not always sent, the
// event is: evicted.go) ends the step in the kubelet's words, lost to
// the infrastructure only when the node's pressure evicted it.
func TestPodEndedEvictedByItsOwnLimit(t *testing.T) {
	t.Parallel()
	s := &Session{ref: executor.Ref{Executor: Name, RunID: "r", Namespace: "ns", Name: "knotless-r"}}
	for _, tt := range []struct {
		message string
		lost    bool
	}{
		{"Pod ephemeral local storage usage exceeds the total limit of containers 32Mi.", false},
		{"The node was low on resource: ephemeral-storage.", true},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{NodeName: "n"},
			Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: tt.message}}
		err := s.podEnded(context.Background(), pod)
		if err == nil || !strings.Contains(err.Error(), tt.message) {
			t.Fatalf("%q: err %v, want the kubelet's words", tt.message, err)
		}
		if got := errors.Is(err, executor.ErrInfrastructure); got != tt.lost {
			t.Errorf("%q: lost to the infrastructure %v, want %v (%v)", tt.message, got, tt.lost, err)
		}
	}
}
