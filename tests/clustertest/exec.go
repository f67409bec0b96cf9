package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"

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
