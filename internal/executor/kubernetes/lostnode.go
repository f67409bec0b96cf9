package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeclient"
)

// reasonDeletionByPodGC is the reason of the DisruptionTarget condition
// the pod garbage collector sets (with phase Failed) on a pod whose Node
// is gone, just before it force-deletes the pod; its message says why
// ("PodGC: node no longer exists").
const reasonDeletionByPodGC = "DeletionByPodGC"

// nodeLost returns the node of a pod the pod garbage collector marked as
// one of a lost node, and the collector's words. Reading the pod is all
// it takes: the runner's credential may not get Nodes.
func nodeLost(pod *corev1.Pod) (node, why string, ok bool) {
	if pod.Spec.NodeName == "" {
		return "", "", false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == reasonDeletionByPodGC {
			why = c.Message
			if why == "" {
				why = c.Reason
			}
			return pod.Spec.NodeName, why, true
		}
	}
	return "", "", false
}

// ignoreExecNoNode turns execFoundNoNode off, so that a test sees a lost
// node named by the pod garbage collector's mark alone (export_test.go).
var ignoreExecNoNode atomic.Bool

// execFoundNoNode reports an exec the API server refused because it has
// no Node of the pod's node name: it looks the Node up to reach the
// pod's kubelet, and a deleted one answers NotFound naming the node (in
// Kubernetes 1.34 as `pods "<node>" not found`, the resource taken from
// the request). It needs no right beyond exec, and comes within a second
// of the Node's deletion.
func execFoundNoNode(execErr error, pod *corev1.Pod) bool {
	node := pod.Spec.NodeName
	if ignoreExecNoNode.Load() || node == "" || node == pod.Name || !apierrors.IsNotFound(execErr) {
		return false
	}
	var st apierrors.APIStatus
	if !errors.As(execErr, &st) {
		return false
	}
	d := st.Status().Details
	return d != nil && d.Name == node
}

// lostNodeError is the run's error for a step whose node is gone; the
// session remembers the node for Stop. It is the infrastructure's
// (executor.Lost).
func (s *Session) lostNodeError(node, why string) error {
	s.mu.Lock()
	s.lostNode = node
	s.mu.Unlock()
	return executor.Lost(fmt.Errorf("node %s of pod %s/%s is gone (%s) while the step ran", node, s.ref.Namespace, s.pod, why))
}

// knownLostNode is the node a step found lost, if any.
func (s *Session) knownLostNode() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostNode
}

// watchPod waits d, watching the run's pod meanwhile from the last
// version the session saw of it (so what changed since, while an exec
// was under way, is replayed): it returns the error naming the node as
// soon as the pod garbage collector's mark shows, also on the pod's
// deletion (the delete event carries it, which no later get could), and
// an error as soon as the pod is deleted without it or ends (podEnded).
// Without a watch it just waits. dropped is when the step's stream first dropped.
func (s *Session) watchPod(ctx context.Context, d time.Duration, dropped time.Time) error {
	// The watch is bounded by d; a reason looked for once the pod has
	// ended has a bound of its own (evictedEvent), within ctx.
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var w watch.Interface
	if _, cs, _, err := s.ex.clients.get(); err == nil {
		w, err = cs.CoreV1().Pods(s.ref.Namespace).Watch(wctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", s.pod).String(),
			ResourceVersion: s.lastPodVersion(),
		})
		if err != nil {
			w = nil
		}
	}
	if w == nil {
		<-wctx.Done()
		return nil
	}
	defer w.Stop()
	for {
		select {
		case <-wctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				<-wctx.Done()
				return nil
			}
			if ev.Type == watch.Error {
				s.sawPod(nil) // too old a version, say: start afresh next time
				continue
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}
			s.sawPod(pod)
			if node, why, lost := nodeLost(pod); lost {
				s.log.Warn("node of the run's pod is gone: the pod garbage collector marked the pod",
					"pod", pod.Name, "node", node, "reason", reasonDeletionByPodGC, "message", why,
					"after_stream_dropped", time.Since(dropped).Round(time.Millisecond))
				return s.lostNodeError(node, why)
			}
			if ended := s.podEnded(ctx, pod); ended != nil {
				s.log.Warn("the run's pod was disrupted or ended", "pod", pod.Name, "node", pod.Spec.NodeName, "err", ended,
					"after_stream_dropped", time.Since(dropped).Round(time.Millisecond))
				return ended
			}
			if ev.Type == watch.Deleted {
				if why := s.evictedEvent(ctx, pod.UID, podReplayWait); why != "" {
					return s.evictedError(pod, why)
				}
				return executor.Lost(fmt.Errorf("pod %s/%s on node %s was deleted while the step ran", s.ref.Namespace, s.pod, pod.Spec.NodeName))
			}
		}
	}
}

// sawPod records the version of the run's pod last seen; nil forgets it.
func (s *Session) sawPod(pod *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.podVersion = ""
	if pod != nil {
		s.podVersion = pod.ResourceVersion
	}
}

func (s *Session) lastPodVersion() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.podVersion
}

// forceDeleteOnLostNodes force-deletes (grace 0) each pod of pods whose
// node is gone (its Node deleted, as a cloud does with a machine it lost):
// no kubelet will ever confirm such a pod's end, and the pod garbage
// collector takes up to 80 s to. checked holds the pods already looked
// at. A pod the collector has marked (nodeLost) is already being
// force-deleted by it: it is left to it, and gone in a moment. A runner
// that may not get Nodes or delete pods (the scoped credential of
// kubecred) cannot do it: a pod on the node a step found lost is then
// left to the collector and put in leftToGC; any other pod is waited for.
func (s *Session) forceDeleteOnLostNodes(ctx context.Context, cs *kubeclient.Clientset, pods []corev1.Pod, checked, leftToGC map[string]bool) {
	lostNode := s.knownLostNode()
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || checked[p.Name] {
			continue
		}
		checked[p.Name] = true
		if node, why, lost := nodeLost(p); lost {
			s.log.Info("pod of a lost node: the pod garbage collector is deleting it", "pod", p.Name, "node", node, "message", why)
			continue
		}
		_, err := cs.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err) && p.Spec.NodeName == lostNode:
			// A step found the node gone without reading it (the exec's
			// NotFound): try the delete, which the credential may allow.
		default:
			continue
		}
		zero := int64(0)
		err = cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      &metav1.Preconditions{UID: &p.UID},
		})
		if apierrors.IsForbidden(err) {
			leftToGC[p.Name] = true
			s.log.Info("may not delete the pod of a lost node: left to the pod garbage collector", "pod", p.Name, "node", p.Spec.NodeName)
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			s.log.Warn("force-delete pod of a lost node", "pod", p.Name, "node", p.Spec.NodeName, "err", err)
			continue
		}
		s.log.Info("force-deleted pod of a lost node", "pod", p.Name, "node", p.Spec.NodeName)
	}
}
