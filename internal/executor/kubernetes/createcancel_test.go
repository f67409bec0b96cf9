package kubernetes_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/tests/clustertest"
)

// cancelAfterJobCreate cancels the run's context once the API server
// has answered the Job's create, and then, as a transport does for a
// request whose context ended before its answer was read, gives the
// caller its context's error: the Job is made, its answer lost.
type cancelAfterJobCreate struct {
	rt     http.RoundTripper
	cancel context.CancelFunc
}

func (c cancelAfterJobCreate) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err != nil || req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/jobs") {
		return resp, err
	}
	c.cancel()
	if cerr := req.Context().Err(); cerr != nil {
		_ = resp.Body.Close()
		return nil, cerr
	}
	return resp, nil
}

// A run cancelled while its Job's create is on the wire (a superseded
// run) leaves no Job: the create is seen through, and the failed start
// deletes what it made. Its answer lost, the Job stayed, with nothing
// to delete it, and its pod held the node from the runner's next runs.
func TestCancelDuringJobCreateLeavesNoJob(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return cancelAfterJobCreate{rt: rt, cancel: cancel} }
	ex := newExecutor(t, c, func(kc *kubernetes.Config) {
		kc.Credentials = kubernetes.Credentials{Namespace: c.Namespace, InCluster: func() (*rest.Config, error) { return cfg, nil }}
	})
	runID := randomID("cc")
	if sess, err := ex.Start(ctx, executor.Spec{RunID: runID, Runner: "did:plc:" + randomID("cc"), Image: c.Image, Timeout: time.Minute}); err == nil {
		_ = sess.Stop(context.Background())
		t.Fatal("a start whose context ended during its Job's create went on")
	}
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	left := -1
	for {
		jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(wctx, metav1.ListOptions{LabelSelector: kubernetes.LabelRun + "=" + runID})
		if err == nil {
			left = len(jobs.Items)
		}
		if left == 0 {
			return
		}
		if wctx.Err() != nil {
			t.Fatalf("%d Jobs of the run left 1 min after its start was cancelled mid-create", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
