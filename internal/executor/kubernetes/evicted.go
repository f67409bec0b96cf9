package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"knotless.dev/run/internal/executor"
)

// evictionEventWait bounds the wait for the kubelet's Evicted event of a
// pod that ended under a step: the kubelet records it before it kills
// the pod, but sends it on its own, later.
const evictionEventWait = 20 * time.Second

// podEnded returns the run's error for a pod no step can be reached in
// any more: disrupted (its status says so) or in a terminal phase, in
// the kubelet's words where it said why. Nil while the pod runs.
//
// A pod evicted for its own ephemeral-storage limit carries no
// DisruptionTarget condition, and the status the kubelet sets on it
// (Failed, Evicted) is computed again from its containers' exits once
// they are stopped, often before the first is sent: the API server then
// sees only Succeeded (the keep-alive exits 0 on TERM) or Failed without
// a reason. The Event the kubelet records, by the pod's UID, is what
// reliably says why.
func (s *Session) podEnded(ctx context.Context, pod *corev1.Pod) error {
	if why, disrupted := podDisrupted(pod); disrupted {
		// The kubelet's Failed/Evicted status did reach the API server
		// this time: its words say whose the eviction was, as the
		// event's do.
		return s.evictedError(pod, why)
	}
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		return nil
	}
	if why := s.evictedEvent(ctx, pod.UID, evictionEventWait); why != "" {
		return s.evictedError(pod, why)
	}
	// Not the infrastructure's for sure: a step may end the pod itself
	// (its keep-alive is in the step's container).
	return fmt.Errorf("%w: pod %s/%s on node %s ended (%s) while the step ran, and no event says why", executor.ErrExitUnknown, s.ref.Namespace, pod.Name, pod.Spec.NodeName, pod.Status.Phase)
}

// evictedError is the run's error for a pod the kubelet evicted, in its
// words. An eviction for the pod's own bounds (its ephemeral-storage
// limit, a container's, an emptyDir's: the kubelet's words name the
// limit) is the run's own doing, which no retry would mend; one for the
// node's pressure is the infrastructure's.
func (s *Session) evictedError(pod *corev1.Pod, why string) error {
	if ownLimit(why) {
		return fmt.Errorf("pod %s/%s on node %s was evicted while the step ran, past its own bound (%s)", s.ref.Namespace, pod.Name, pod.Spec.NodeName, why)
	}
	return s.disruptedError(pod, why)
}

// ownLimit says whether the kubelet's eviction message names one of the
// pod's own limits ("Pod ephemeral local storage usage exceeds the total
// limit of containers 32Mi.", "Container run exceeded its local
// ephemeral storage limit", "Usage of EmptyDir volume ... exceeds the
// limit") rather than the node's pressure ("The node was low on
// resource: ephemeral-storage.").
func ownLimit(why string) bool {
	return strings.Contains(why, "limit") && !strings.Contains(why, "The node was low on resource")
}

// evictedEvent returns the reason and message of the kubelet's Evicted
// event for the pod with uid, waiting up to d for it; "" if there is
// none by then (or no client to ask).
func (s *Session) evictedEvent(ctx context.Context, uid types.UID, d time.Duration) string {
	if uid == "" {
		return ""
	}
	_, cs, _, err := s.ex.clients.get()
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	events := cs.CoreV1().Events(s.ref.Namespace)
	sel := fields.Set{"involvedObject.uid": string(uid), "reason": "Evicted"}.String()
	// A watch the server ends early is taken up again from a new list,
	// a few times at most.
	for range 3 {
		list, err := events.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return ""
		}
		if len(list.Items) > 0 {
			return reasonMessage(list.Items[0].Reason, list.Items[0].Message)
		}
		w, err := events.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return ""
		}
		why := firstEvent(ctx, w)
		w.Stop()
		if why != "" {
			return why
		}
	}
	return ""
}

// firstEvent returns the reason and message of the first event w
// delivers, or "" when w or ctx ends first.
func firstEvent(ctx context.Context, w watch.Interface) string {
	for {
		select {
		case <-ctx.Done():
			return ""
		case ev, ok := <-w.ResultChan():
			if !ok {
				return ""
			}
			if e, isEvent := ev.Object.(*corev1.Event); isEvent && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				return reasonMessage(e.Reason, e.Message)
			}
		}
	}
}
