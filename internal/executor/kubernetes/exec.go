package kubernetes

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

// streams are one exec's standard streams; nil ones are not opened.
type streams struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

// exec runs command in the run container and returns its exit code. An
// error means the exec itself failed (the stream broke, the pod is gone,
// the credentials were refused); a command that ran and exited non-zero
// is a code, not an error.
func (s *Session) exec(ctx context.Context, command []string, st streams) (int, error) {
	cfg, cs, _, err := s.ex.clients.get()
	if err != nil {
		return 0, err
	}
	req := cs.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(s.ref.Namespace).Name(s.pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: containerName,
			Command:   command,
			Stdin:     st.stdin != nil,
			Stdout:    st.stdout != nil,
			Stderr:    st.stderr != nil,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", s.pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", s.pod, err)
	}
	// Fall back to SPDY only when the WebSocket upgrade itself failed, as
	// kubectl does: any other error would run the command a second time.
	exe, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", s.pod, err)
	}
	err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: st.stdin, Stdout: st.stdout, Stderr: st.stderr})
	var exitErr utilexec.CodeExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exitErr):
		return exitErr.Code, nil
	}
	return 0, fmt.Errorf("exec in %s: %w", s.pod, err)
}
