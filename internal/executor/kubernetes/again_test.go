package kubernetes_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/tests/clustertest"
)

// TestRunAgainWhileItsEarlierPodGoes: a run started again under its id
// (released at a stop, or forgotten after a kill, and run again by the
// next process) while the pod of its earlier Job is still going away:
// its Job has the same name, but the new session is the new pod's
// alone (its files are not the earlier pod's), and the earlier
// session's stop, late, deletes nothing of it.
func TestRunAgainWhileItsEarlierPodGoes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := context.Background()
	runner := "did:plc:" + randomID("again")
	mod := func(cfg *kubernetes.Config) { cfg.Runner = runner }
	spec := executor.Spec{RunID: randomID("a"), Runner: runner, Image: c.Image, Timeout: 5 * time.Minute}
	first, err := newExecutor(t, c, mod).Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var marker bytes.Buffer
	tw := tar.NewWriter(&marker)
	if err := tw.WriteHeader(&tar.Header{Name: "earlier", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte("x"))
	_ = tw.Close()
	if err := first.Put(ctx, first.Dirs().Work, &marker); err != nil {
		t.Fatal(err)
	}
	// The earlier Job goes as a sweep deletes it: at once, its pod after.
	bg := metav1.DeletePropagationBackground
	if err := c.Clientset.BatchV1().Jobs(c.Namespace).Delete(ctx, first.Ref().Name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatal(err)
	}
	again, err := newExecutor(t, c, mod).Start(ctx, spec)
	if err != nil {
		t.Fatalf("start the run again while its earlier pod goes: %v", err)
	}
	var work bytes.Buffer
	if err := again.Get(ctx, again.Dirs().Work, &work); err != nil {
		t.Fatalf("the new session's work directory: %v", err)
	}
	tr := tar.NewReader(&work)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "earlier" || h.Name == "./earlier" {
			t.Fatal("the run started again is in its earlier pod: its work directory has the earlier session's file")
		}
	}
	// The earlier session's stop comes late: the Job of its name is not
	// its own any more.
	if err := first.Stop(ctx); err != nil {
		t.Errorf("the earlier session's stop: %v", err)
	}
	if _, err := c.Clientset.BatchV1().Jobs(c.Namespace).Get(ctx, again.Ref().Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the run's new Job after the earlier session's stop: %v", err)
	}
	if err := again.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
