package clustertest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"knotless.dev/run/internal/kube/kubeexec"
)

// Exec runs cmd in a container of a pod, streaming stdin (when not nil) to
// it and its output to stdout and stderr (each when not nil). It returns
// the command's exit code; err is for a failure of the stream itself. It
// is the executor's own exec (internal/kube/kubeexec).
func (c *Cluster) Exec(ctx context.Context, namespace, pod, container string, cmd []string,
	stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	return kubeexec.Run(ctx, c.Config, c.Clientset.CoreV1().RESTClient(), kubeexec.Target{Namespace: namespace, Pod: pod, Container: container},
		cmd, kubeexec.Streams{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// WaitForCommand waits until the Ready pod matching selector exists and
// cmd, run in its container, exits 0: e.g. a step has reached the point
// where it touches a file. It gives up when ctx ends.
func (c *Cluster) WaitForCommand(ctx context.Context, namespace, selector, container string, cmd []string) error {
	var last string
	for {
		pod, err := c.WaitForPod(ctx, namespace, selector, PodReady)
		if err != nil {
			return fmt.Errorf("%w (last try: %s)", err, last)
		}
		// Two buffers: the exec copies stdout and stderr concurrently.
		var stdout, stderr bytes.Buffer
		code, err := c.Exec(ctx, namespace, pod.Name, container, cmd, nil, &stdout, &stderr)
		if err == nil && code == 0 {
			return nil
		}
		last = fmt.Sprintf("exit %d, %v: %q", code, err, stdout.String()+stderr.String())
		select {
		case <-ctx.Done():
			return fmt.Errorf("%v in pod %s/%s did not succeed (%s): %w", cmd, namespace, pod.Name, last, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
