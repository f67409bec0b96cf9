package kubernetes

import (
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestNodeLost(t *testing.T) {
	t.Parallel()
	// What the pod garbage collector of Kubernetes 1.34 sets on the pod
	// of a deleted Node before it force-deletes it (seen on the test
	// cluster by TestTwoNodesNodeLostScoped).
	podGC := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: "DeletionByPodGC", Message: "PodGC: node no longer exists"}
	pod := func(node string, phase corev1.PodPhase, conds ...corev1.PodCondition) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase, Conditions: conds}}
	}
	for _, tc := range []struct {
		name     string
		pod      *corev1.Pod
		node     string
		why      string
		wantLost bool
	}{
		{"running, no condition", pod("n2", corev1.PodRunning, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}), "", "", false},
		{"marked by the pod GC", pod("n2", corev1.PodFailed, podGC), "n2", "PodGC: node no longer exists", true},
		{"marked, phase not yet seen", pod("n2", corev1.PodRunning, podGC), "n2", "PodGC: node no longer exists", true},
		{"marked without a message", pod("n2", corev1.PodFailed, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByPodGC"}), "n2", "DeletionByPodGC", true},
		// Other disruptions do not say the node is gone.
		{"evicted", pod("n2", corev1.PodRunning, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI"}), "", "", false},
		{"preempted", pod("n2", corev1.PodFailed, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}), "", "", false},
		{"condition false", pod("n2", corev1.PodRunning, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionFalse, Reason: "DeletionByPodGC"}), "", "", false},
		{"never scheduled", pod("", corev1.PodFailed, podGC), "", "", false},
		{"failed on a live node", pod("n2", corev1.PodFailed), "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node, why, lost := nodeLost(tc.pod)
			if lost != tc.wantLost || node != tc.node || why != tc.why {
				t.Errorf("nodeLost = %q, %q, %v; want %q, %q, %v", node, why, lost, tc.node, tc.why, tc.wantLost)
			}
		})
	}
}

func TestExecFoundNoNode(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "knotless-run1-abcde"}, Spec: corev1.PodSpec{NodeName: "n2"}}
	// What the API server of Kubernetes 1.34 answers an exec into a pod
	// whose Node is deleted (seen on the test cluster).
	noNode := apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "n2")
	for _, tc := range []struct {
		name string
		err  error
		pod  *corev1.Pod
		want bool
	}{
		{"no node, wrapped", fmt.Errorf("exec in ns/knotless-run1-abcde: %w", noNode), pod, true},
		{"pod not found", apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "knotless-run1-abcde"), pod, false},
		{"another node", apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "n3"), pod, false},
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "n2", errors.New("no")), pod, false},
		{"stream dropped", errors.New("stream ended without the step's exit line"), pod, false},
		{"no error", nil, pod, false},
		{"unscheduled pod", noNode, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := execFoundNoNode(tc.err, tc.pod); got != tc.want {
				t.Errorf("execFoundNoNode(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
