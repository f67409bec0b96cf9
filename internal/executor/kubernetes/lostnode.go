package kubernetes

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// forceDeleteOnLostNodes force-deletes (grace 0) each pod of pods whose
// node is gone (its Node deleted, as a cloud does with a machine it lost):
// no kubelet will ever confirm such a pod's end, and the pod garbage
// collector takes up to a minute to. checked holds the pods already
// looked at. A runner that may not get Nodes or delete pods leaves them
// to the garbage collector.
func (s *Session) forceDeleteOnLostNodes(ctx context.Context, cs kubernetes.Interface, pods []corev1.Pod, checked map[string]bool) {
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || checked[p.Name] {
			continue
		}
		checked[p.Name] = true
		if _, err := cs.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			continue
		}
		zero := int64(0)
		err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      &metav1.Preconditions{UID: &p.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) {
			s.log.Warn("force-delete pod of a lost node", "pod", p.Name, "node", p.Spec.NodeName, "err", err)
			continue
		}
		s.log.Info("force-deleted pod of a lost node", "pod", p.Name, "node", p.Spec.NodeName)
	}
}
