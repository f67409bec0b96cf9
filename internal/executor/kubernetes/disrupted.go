package kubernetes

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"knotless.dev/run/internal/executor"
)

// podDisrupted returns what Kubernetes said of a pod it is taking away
// or took: the DisruptionTarget condition's reason and message (an
// eviction through the API, a preemption, a NoExecute taint, the
// kubelet's node-pressure eviction or graceful shutdown, the pod garbage
// collector), and the kubelet's own reason Evicted on a failed pod (what
// a kubelet that sets no condition says of a node-pressure eviction).
func podDisrupted(pod *corev1.Pod) (string, bool) {
	var parts []string
	disrupted := false
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			disrupted = true
			if rm := reasonMessage(c.Reason, c.Message); rm != "" {
				parts = append(parts, rm)
			}
		}
	}
	if pod.Status.Reason == "Evicted" {
		disrupted = true
		parts = append(parts, reasonMessage(pod.Status.Reason, pod.Status.Message))
	}
	if !disrupted {
		return "", false
	}
	if len(parts) == 0 {
		return string(corev1.DisruptionTarget), true
	}
	return strings.Join(parts, "; "), true
}

func reasonMessage(reason, message string) string {
	message = strings.TrimSpace(message)
	switch {
	case reason == "":
		return message
	case message == "":
		return reason
	}
	return reason + ": " + message
}

// disruptedError is the run's error for a step whose pod Kubernetes
// took away, in its words: the infrastructure's (executor.Lost).
func (s *Session) disruptedError(pod *corev1.Pod, why string) error {
	return executor.Lost(fmt.Errorf("pod %s/%s on node %s was disrupted while the step ran (%s)", s.ref.Namespace, pod.Name, pod.Spec.NodeName, why))
}
