package clustertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// Exec runs cmd in a container of a pod, streaming stdin (when not nil) to
// it and its output to stdout and stderr (each when not nil). It returns
// the command's exit code; err is for a failure of the stream itself.
//
// It speaks WebSocket and falls back to SPDY only when the upgrade itself
// fails, as kubectl does: a fallback on any error would run the command a
// second time after it exited non-zero.
func (c *Cluster) Exec(ctx context.Context, namespace, pod, container string, cmd []string,
	stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	req := c.Clientset.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container,
			Command:   cmd,
			Stdin:     stdin != nil,
			Stdout:    stdout != nil,
			Stderr:    stderr != nil,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(c.Config, "GET", req.URL().String())
	if err != nil {
		return -1, fmt.Errorf("make websocket executor: %w", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(c.Config, "POST", req.URL())
	if err != nil {
		return -1, fmt.Errorf("make spdy executor: %w", err)
	}
	exe, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return -1, fmt.Errorf("make exec executor: %w", err)
	}
	err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit) && exit.Exited():
		return exit.ExitStatus(), nil
	default:
		return -1, fmt.Errorf("exec in %s/%s: %w", namespace, pod, err)
	}
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
