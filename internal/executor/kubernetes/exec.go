package kubernetes

import (
	"context"

	"knotless.dev/run/internal/kube/kubeexec"
)

// exec runs command in the run container and returns its exit code. An
// error means the exec itself failed (the stream broke, the pod is gone,
// the credentials were refused); a command that ran and exited non-zero
// is a code, not an error.
func (s *Session) exec(ctx context.Context, command []string, st kubeexec.Streams) (int, error) {
	return s.execIn(ctx, containerName, command, st)
}

// execIn is exec in the container of the pod named container.
func (s *Session) execIn(ctx context.Context, container string, command []string, st kubeexec.Streams) (int, error) {
	cfg, cs, _, err := s.ex.clients.get()
	if err != nil {
		return -1, err
	}
	return kubeexec.Run(ctx, cfg, cs.CoreV1().RESTClient(), kubeexec.Target{Namespace: s.ref.Namespace, Pod: s.pod, Container: container}, command, st)
}
