package kubernetes

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/tests/clustertest"
)

// TestJobReplacesOnlyRefusedPods: on the real cluster, a Job as BuildJob
// makes it replaces a pod its node refused at admission, admissionRetries
// times, and admissionRefused knows the kubelet's refusal; a pod whose
// container exits non-zero fails the Job at once, with no second pod.
func TestJobReplacesOnlyRefusedPods(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	nodes, err := c.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) == 0 {
		t.Fatalf("list nodes: %v (%d)", err, len(nodes.Items))
	}

	build := func(runID string) *batchv1.Job {
		job, err := BuildJob(c.Namespace, executor.Spec{RunID: runID, Runner: "did:plc:admission", Image: c.Image, Timeout: 5 * time.Minute}, PodOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return job
	}
	// failed waits for the Job's Failed condition and returns its pods.
	failed := func(job *batchv1.Job) (string, []corev1.Pod) {
		t.Helper()
		if _, err := c.Clientset.BatchV1().Jobs(c.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var reason string
		err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			j, err := c.Clientset.BatchV1().Jobs(c.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, cond := range j.Status.Conditions {
				if cond.Type == batchv1.JobFailed && cond.Status == corev1.ConditionTrue {
					reason = cond.Reason
					return true, nil
				}
			}
			return false, nil
		})
		pods, lerr := c.Clientset.CoreV1().Pods(c.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job.Name})
		if err != nil || lerr != nil {
			t.Fatalf("job %s did not fail: %v (pods: %v)", job.Name, err, lerr)
		}
		return reason, pods.Items
	}

	// Placed on the node by name, past the scheduler, with a selector the
	// node lacks: its kubelet refuses every pod (NodeAffinity).
	refused := build("refused")
	refused.Spec.Template.Spec.NodeName = nodes.Items[0].Name
	refused.Spec.Template.Spec.NodeSelector = map[string]string{"dev.knotless.test/absent": "true"}
	reason, pods := failed(refused)
	if reason != batchv1.JobReasonBackoffLimitExceeded || len(pods) != admissionRetries+1 {
		t.Errorf("refused at admission: the job failed with %q after %d pods, want %q after %d", reason, len(pods), batchv1.JobReasonBackoffLimitExceeded, admissionRetries+1)
	}
	for i := range pods {
		if !admissionRefused(&pods[i]) {
			t.Errorf("pod %s is not seen as refused at admission: phase %s, reason %q (%s), containers %+v",
				pods[i].Name, pods[i].Status.Phase, pods[i].Status.Reason, pods[i].Status.Message, pods[i].Status.ContainerStatuses)
		}
	}

	exits := build("exits")
	exits.Spec.Template.Spec.Containers[0].Command = []string{"sh", "-c", "exit 3"}
	reason, pods = failed(exits)
	if reason != batchv1.JobReasonPodFailurePolicy || len(pods) != 1 {
		t.Errorf("exit 3: the job failed with %q after %d pods, want %q after 1", reason, len(pods), batchv1.JobReasonPodFailurePolicy)
	}
	for i := range pods {
		if admissionRefused(&pods[i]) {
			t.Errorf("pod %s that ran is seen as refused at admission", pods[i].Name)
		}
	}
}
