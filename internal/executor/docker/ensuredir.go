package docker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
)

// ensureDir makes dir and its parents in the container, as the
// container's user, when dir does not exist: the Engine API copies only
// into an existing directory, and a relative cache path under the work
// directory exists only once a run or its checkout made it.
func (s *Session) ensureDir(ctx context.Context, dir string) error {
	_, err := s.ex.cli.ContainerStatPath(ctx, s.id, client.ContainerStatPathOptions{Path: dir})
	switch {
	case err == nil:
		return nil
	case !cerrdefs.IsNotFound(err):
		return s.ex.daemonError(fmt.Errorf("put %s: %w", dir, err))
	}
	ex, err := s.ex.cli.ExecCreate(ctx, s.id, client.ExecCreateOptions{
		AttachStdout: true, AttachStderr: true,
		Cmd: []string{"mkdir", "-p", "--", dir},
	})
	if err != nil {
		return s.ex.daemonError(fmt.Errorf("put %s: create mkdir exec: %w", dir, err))
	}
	s.mu.Lock()
	s.execs = append(s.execs, ex.ID)
	s.mu.Unlock()
	att, err := s.ex.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return s.ex.daemonError(fmt.Errorf("put %s: start mkdir exec: %w", dir, err))
	}
	defer att.Close()
	stop := context.AfterFunc(ctx, func() { att.Close() })
	defer stop()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, io.LimitReader(att.Reader, 64<<10)); err != nil {
		return fmt.Errorf("put %s: mkdir: %w", dir, err)
	}
	st, err := s.ex.inspectExec(ctx, ex.ID)
	if err != nil {
		return fmt.Errorf("put %s: mkdir: %w", dir, err)
	}
	if st.Running || st.ExitCode == nil || *st.ExitCode != 0 {
		return fmt.Errorf("put %s: mkdir failed: %s", dir, strings.TrimSpace(out.String()))
	}
	return nil
}
