// Package kubeexec runs a command in a container of a running pod through
// the API server's exec subresource: the one way the Kubernetes executor
// and the test cluster's harness (tests/clustertest) exec into a pod.
package kubeexec

import (
	"context"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"knotless.dev/run/internal/kube/kubeclient"
)

// Streams are one exec's standard streams; nil ones are not opened.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Target is the container an exec runs in.
type Target struct {
	Namespace, Pod, Container string
}

// Run runs command in the target container, streaming st, and returns
// the command's exit code. An error means the exec itself failed (the
// stream broke, the pod is gone, the credentials were refused) and the
// code is then -1; a command that ran and exited non-zero is a code, not
// an error.
//
// core is a REST client of the core API group (cs.CoreV1().RESTClient()
// of internal/kube/kubeclient's Clientset, or of client-go's); cfg is the
// configuration it was made from.
//
// It speaks WebSocket and falls back to SPDY only when the upgrade itself
// fails, as kubectl does: a fallback on any other error would run the
// command a second time after it exited non-zero.
func Run(ctx context.Context, cfg *rest.Config, core rest.Interface, to Target, command []string, st Streams) (int, error) {
	req := core.Post().
		Resource("pods").Namespace(to.Namespace).Name(to.Pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: to.Container,
			Command:   command,
			Stdin:     st.Stdin != nil,
			Stdout:    st.Stdout != nil,
			Stderr:    st.Stderr != nil,
		}, kubeclient.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return -1, fmt.Errorf("exec in %s/%s: websocket executor: %w", to.Namespace, to.Pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return -1, fmt.Errorf("exec in %s/%s: spdy executor: %w", to.Namespace, to.Pod, err)
	}
	exe, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return -1, fmt.Errorf("exec in %s/%s: %w", to.Namespace, to.Pod, err)
	}
	err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: st.Stdin, Stdout: st.Stdout, Stderr: st.Stderr})
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit) && exit.Exited():
		return exit.ExitStatus(), nil
	}
	return -1, fmt.Errorf("exec in %s/%s: %w", to.Namespace, to.Pod, err)
}
