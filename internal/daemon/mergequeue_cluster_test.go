package daemon_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/clustertest"
)

// TestMergeQueueOnKubernetes: one batch of two pulls on the Kubernetes
// executor: pre-flights and the batch run as Jobs without a secret, the
// batch lands in order, its landing runs main's push workflow with the
// secret, and no Job of the runner is left.
func TestMergeQueueOnKubernetes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	m := newMQWorld(t, nil, nil)
	base := m.head()
	p1, c1 := m.pull("one", "", map[string]string{"one.txt": "1\n"})
	p2, c2 := m.pull("two", "", map[string]string{"two.txt": "2\n"})
	m.enqueue(p1, c1)
	m.enqueue(p2, c2)
	m.start(m.config(onCluster(t, c, m.world, kubernetes.PodOptions{Image: c.Image})))

	m.waitFor("landing", 5*time.Minute, func() bool {
		return len(list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)) > 0
	})
	if diff := cmp.Diff([]string{"one", "two"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	if _, b := m.waitFinal("batch", m.head(), time.Minute); b.Status != "success" {
		t.Errorf("batch check: %+v", b)
	}
	if _, post := m.waitFinal("post", m.head(), 3*time.Minute); post.Status != "success" {
		t.Errorf("post check: %+v", post)
	}
	selector := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(m.Runner.DID.String())
	m.waitFor("no Job of the runner left", time.Minute, func() bool {
		jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		return len(jobs.Items) == 0
	})
}
