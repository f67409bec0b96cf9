package kubernetes

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
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
