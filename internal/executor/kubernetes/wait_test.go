package kubernetes

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pullingPod is a pod whose one container waits with reason and message.
func pullingPod(reason, msg string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Image: "10.0.0.1:5000/ci/img:1",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}},
		}}},
	}
}

// Every failed pull of a pod without pull secrets ends the wait at
// once (the grace is an hour here), naming the image and the kubelet's
// words; a denial also names --image-pull-secret. Before issue 35 only
// a denial did: a registry that does not answer, or an image that is
// not there, waited out the grace.
func TestCheckPullFails(t *testing.T) {
	t.Parallel()
	tests := []struct {
		reason, msg string
		denied      bool
	}{
		// containerd 1.6's words for a registry that wants basic
		// credentials and got none (tests/registry, TestImagePullDenied).
		{"ErrImagePull", `failed to pull and unpack image "10.0.0.1:5000/ci/img:1": failed to resolve reference "10.0.0.1:5000/ci/img:1": pulling from host 10.0.0.1:5000 failed with status code [manifests 1]: 401 Unauthorized`, true},
		{"ErrImagePull", `failed to pull and unpack image "x": failed to copy: httpReadSeeker: failed open: unexpected status code http://x: 403 Forbidden`, true},
		{"ErrImagePull", `failed to resolve reference "x": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed`, true},
		{"ErrImagePull", `failed to pull and unpack image "x": failed to resolve reference "x": x: not found`, false},
		{"ErrImagePull", `failed to resolve reference "x": dial tcp 10.0.0.1:5000: connect: connection refused`, false},
		{"ImagePullBackOff", `Back-off pulling image "x"`, false},
	}
	for _, tt := range tests {
		w := &podWaiter{job: &batchv1.Job{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), grace: time.Hour, started: time.Now()}
		_, _, err := w.check(pullingPod(tt.reason, tt.msg))
		if err == nil {
			t.Errorf("%s %q: the wait goes on, want it ended at once", tt.reason, tt.msg)
			continue
		}
		if !strings.Contains(err.Error(), "cannot pull image 10.0.0.1:5000/ci/img:1") || !strings.Contains(err.Error(), tt.reason) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("error %q does not name the image, the reason and the kubelet's words", err)
		}
		if got := strings.Contains(err.Error(), "the registry denied access") && strings.Contains(err.Error(), "--image-pull-secret"); got != tt.denied {
			t.Errorf("error %q: names the denial and --image-pull-secret: %v, want %v", err, got, tt.denied)
		}
	}
}

// With --image-pull-secret a denial is not final at once: a busy
// kubelet whose secret cache has not synced pulls without the secret
// first and with it at the retry. Once the grace is out the error names
// the secret.
func TestCheckPullDeniedWithSecret(t *testing.T) {
	t.Parallel()
	denied := `failed to pull and unpack image "10.0.0.1:5000/ci/img:1": failed to resolve reference "10.0.0.1:5000/ci/img:1": pulling from host 10.0.0.1:5000 failed with status code [manifests 1]: 401 Unauthorized`
	withSecret := func(pod *corev1.Pod) *corev1.Pod {
		pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry-pull"}}
		return pod
	}
	pod := withSecret(pullingPod("ErrImagePull", denied))
	w := &podWaiter{job: &batchv1.Job{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), grace: time.Hour, started: time.Now()}
	if _, _, err := w.check(pod); err != nil {
		t.Errorf("a first denial with a pull secret ended the wait: %v", err)
	}
	// The kubelet's back-off after it waits too; a registry that does
	// not answer does not.
	if _, _, err := w.check(withSecret(pullingPod("ImagePullBackOff", `Back-off pulling image "x"`))); err != nil {
		t.Errorf("a back-off with a pull secret ended the wait: %v", err)
	}
	refused := withSecret(pullingPod("ErrImagePull", `failed to resolve reference "x": dial tcp 10.0.0.1:5000: connect: connection refused`))
	if _, _, err := (&podWaiter{job: &batchv1.Job{}, log: w.log, grace: time.Hour}).check(refused); err == nil {
		t.Error("a registry that refuses the connection, with a pull secret: the wait goes on, want it ended at once")
	}
	w.pullFailingSince = time.Now().Add(-2 * time.Hour)
	_, _, err := w.check(pod)
	if err == nil || !strings.Contains(err.Error(), "denied access with the pull secrets registry-pull") {
		t.Errorf("after the grace: %v, want the denial naming the secret", err)
	}
}

// refusedPod is a pod its node refused at admission, as the kubelet
// words it when its view of the node's labels lags the scheduler's.
func refusedPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "NodeAffinity",
			Message: "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"},
	}
}

// A pod its node refused at admission ran nothing: the wait goes on for
// the pod the Job makes next, up to admissionRetries of them; one more
// ends it naming the node and the kubelet's words. A pod that ran, or
// was disrupted, ends the wait at once.
func TestCheckAdmissionRefused(t *testing.T) {
	t.Parallel()
	w := &podWaiter{job: &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "j"}}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), grace: time.Hour, started: time.Now()}
	for i := range admissionRetries {
		p := refusedPod("refused-" + string(rune('a'+i)))
		for range 2 { // a pod's later events count once
			if _, done, err := w.check(p); done || err != nil {
				t.Fatalf("refusal %d of %d ended the wait: done %v, %v", i+1, admissionRetries, done, err)
			}
		}
	}
	_, _, err := w.check(refusedPod("refused-last"))
	if err == nil || !strings.Contains(err.Error(), "refused 3 pods") || !strings.Contains(err.Error(), "node node-a: NodeAffinity: Pod was rejected") {
		t.Errorf("refusal %d: %v, want an error naming the count, node and reason", admissionRetries+1, err)
	}

	ran := refusedPod("ran")
	ran.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}}}
	disrupted := refusedPod("disrupted")
	disrupted.Status.Reason = "Evicted"
	disrupted.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}
	noReason := refusedPod("no-reason")
	noReason.Status.Reason = ""
	for _, tt := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{ran, "ended (Failed) before it was ready"},
		{disrupted, "was disrupted before the run started in it (Evicted: Pod was rejected"},
		{noReason, "ended (Failed) before it was ready"},
	} {
		fresh := &podWaiter{job: &batchv1.Job{}, log: w.log, grace: time.Hour, started: time.Now()}
		if _, _, err := fresh.check(tt.pod); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("pod %s: %v, want the wait ended at once: %s", tt.pod.Name, err, tt.want)
		}
	}

	// Evicted while still Running and Ready (the kubelet has not killed
	// it yet): no step may start in it.
	evicting := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "evicting"}, Spec: corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI", Message: "Eviction API: evicting"},
		}}}
	fresh := &podWaiter{job: &batchv1.Job{}, log: w.log, grace: time.Hour, started: time.Now()}
	if ready, done, err := fresh.check(evicting); ready != nil || done || err == nil || !strings.Contains(err.Error(), "EvictionByEvictionAPI: Eviction API: evicting") {
		t.Errorf("a Ready pod being evicted: ready %v, done %v, %v; want the wait ended with the eviction's words", ready != nil, done, err)
	}
}
