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

// A pull the registry denies ends the wait at once (the grace is an hour
// here), naming the image and the flag; other pull failures wait out the
// grace.
func TestCheckPullDenied(t *testing.T) {
	t.Parallel()
	tests := []struct {
		reason, msg string
		wantErr     bool
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
		if gotErr := err != nil; gotErr != tt.wantErr {
			t.Errorf("%s %q: error %v, want one: %v", tt.reason, tt.msg, err, tt.wantErr)
			continue
		}
		if err != nil && (!strings.Contains(err.Error(), "cannot pull image 10.0.0.1:5000/ci/img:1: the registry denied access") ||
			!strings.Contains(err.Error(), "--image-pull-secret") || !strings.Contains(err.Error(), tt.msg)) {
			t.Errorf("error %q does not name the image, the denial and --image-pull-secret", err)
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
	pod := pullingPod("ErrImagePull", denied)
	pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry-pull"}}
	w := &podWaiter{job: &batchv1.Job{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), grace: time.Hour, started: time.Now()}
	if _, _, err := w.check(pod); err != nil {
		t.Errorf("a first denial with a pull secret ended the wait: %v", err)
	}
	w.pullFailingSince = time.Now().Add(-2 * time.Hour)
	_, _, err := w.check(pod)
	if err == nil || !strings.Contains(err.Error(), "denied access with the pull secrets registry-pull") {
		t.Errorf("after the grace: %v, want the denial naming the secret", err)
	}
}
