package docker

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"knotless.dev/run/internal/executor"
)

// LabelService on a service's container names the service.
const LabelService = "dev.knotless.service"

// serviceLogMax bounds a service container's log on the daemon's disk.
const serviceLogMax = "10m"

// service is one service container of a run.
type service struct {
	executor.Service
	id      string
	started time.Time
}

// startServices creates and starts spec's services, each a container in
// the run container's network namespace (a step reaches it at
// localhost), locked down like it, and returns once every one is ready.
// The containers made are in s.services for remove, whatever fails.
func (s *Session) startServices(ctx context.Context, spec executor.Spec, labels map[string]string, res container.Resources) error {
	e := s.ex
	yes := true
	pids := e.cfg.PidsLimit
	res.PidsLimit = &pids
	for _, svc := range spec.Services {
		if err := e.ensureImage(ctx, svc.Image, s.log); err != nil {
			return fmt.Errorf("service %s: %w", svc.Name, err)
		}
		sl := map[string]string{LabelService: svc.Name}
		for k, v := range labels {
			sl[k] = v
		}
		cfg := &container.Config{Image: svc.Image, Labels: sl}
		for _, v := range svc.Env {
			cfg.Env = append(cfg.Env, v.Name+"="+v.Value)
		}
		if len(svc.Command) > 0 {
			cfg.Entrypoint, cfg.Cmd = svc.Command, []string{}
		}
		name := s.names.container + "-svc-" + svc.Name
		created, err := e.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
			Name:   name,
			Config: cfg,
			HostConfig: &container.HostConfig{
				NetworkMode:  container.NetworkMode("container:" + s.id),
				Init:         &yes,
				CapDrop:      []string{"ALL"},
				CapAdd:       e.cfg.Capabilities,
				SecurityOpt:  []string{"no-new-privileges"},
				IpcMode:      container.IPCModePrivate,
				CgroupnsMode: container.CgroupnsModePrivate,
				LogConfig:    container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": serviceLogMax, "max-file": "1"}},
				Resources:    res,
			},
		})
		if err != nil {
			return e.daemonError(fmt.Errorf("create container %s of service %s: %w", name, svc.Name, err))
		}
		s.services = append(s.services, &service{Service: svc, id: created.ID})
		if _, err := e.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
			return e.daemonError(fmt.Errorf("start container %s of service %s: %w", name, svc.Name, err))
		}
		s.services[len(s.services)-1].started = time.Now()
	}
	for _, svc := range s.services {
		if err := s.awaitReady(ctx, svc); err != nil {
			return err
		}
		s.log.Info("service ready", "service", svc.Name, "after", time.Since(svc.started).Round(time.Millisecond))
	}
	return nil
}

// awaitReady probes svc every second until it is ready, it ends, or its
// start timeout from its container's start passes.
func (s *Session) awaitReady(ctx context.Context, svc *service) error {
	for {
		if why, ended := s.serviceEnded(ctx, svc); ended {
			return &executor.ServiceError{Service: svc.Name, Why: "ended before it was ready: " + why, Tail: s.serviceTail(ctx, svc)}
		}
		if s.probe(ctx, svc) {
			return nil
		}
		if time.Since(svc.started) >= svc.Ready.Timeout {
			return &executor.ServiceError{Service: svc.Name, Why: fmt.Sprintf("did not become ready within its start timeout %s (%s)", svc.Ready.Timeout, probeString(svc.Ready)), Tail: s.serviceTail(ctx, svc)}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// probe runs svc's probe once: a TCP port is one a socket listens on in
// the run's network namespace (read from the run container's
// /proc/net/tcp with sh alone); an HTTP path answers a GET from the run
// container (its wget or curl); a command exits 0 in the service's
// container.
func (s *Session) probe(ctx context.Context, svc *service) bool {
	p := svc.Ready
	switch {
	case p.TCP != 0:
		code, out, err := s.execIn(ctx, s.id, []string{"sh", "-c", `for f in /proc/net/tcp /proc/net/tcp6; do [ -r "$f" ] && while IFS= read -r l; do printf '%s\n' "$l"; done < "$f"; done; :`})
		return err == nil && code == 0 && listening(out, p.TCP)
	case p.HTTPPath != "":
		url := "http://127.0.0.1:" + strconv.Itoa(p.HTTPPort) + p.HTTPPath
		code, _, err := s.execIn(ctx, s.id, []string{"sh", "-c", `wget -q -O /dev/null "$1" 2>/dev/null || curl -fsS -o /dev/null "$1"`, "knotless-probe", url})
		return err == nil && code == 0
	case p.Command != "":
		code, _, err := s.execIn(ctx, svc.id, []string{"sh", "-c", p.Command})
		return err == nil && code == 0
	}
	return true
}

// listening reports whether the /proc/net/tcp{,6} text table holds a
// socket in state LISTEN (0A) on port.
func listening(table string, port int) bool {
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(strings.NewReader(table))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 3 && f[3] == "0A" && strings.HasSuffix(f[1], want) {
			return true
		}
	}
	return false
}

// probeString says how a probe tells its service is ready.
func probeString(p executor.Probe) string {
	switch {
	case p.TCP != 0:
		return fmt.Sprintf("tcp port %d", p.TCP)
	case p.HTTPPath != "":
		return fmt.Sprintf("http GET :%d%s", p.HTTPPort, p.HTTPPath)
	case p.Command != "":
		return fmt.Sprintf("command %q", p.Command)
	}
	return "running"
}

// serviceEnded says how svc's container ended, if it has.
func (s *Session) serviceEnded(ctx context.Context, svc *service) (string, bool) {
	in, err := s.ex.cli.ContainerInspect(ctx, svc.id, client.ContainerInspectOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		return "its container is gone", true
	case err != nil:
		return "", false // asked again
	}
	st := in.Container.State
	if st == nil || st.Running {
		return "", false
	}
	why := "exit " + strconv.Itoa(st.ExitCode)
	if st.OOMKilled {
		why += " (OOMKilled)"
	}
	return why, true
}

// serviceTail is svc's last log lines, or a line saying why they could
// not be read.
func (s *Session) serviceTail(ctx context.Context, svc *service) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var b bytes.Buffer
	if err := s.serviceLog(ctx, svc, strconv.Itoa(executor.ServiceTailLines), &b); err != nil {
		return fmt.Sprintf("(its log could not be read: %v)", err)
	}
	return b.String()
}

func (s *Session) serviceLog(ctx context.Context, svc *service, tail string, w io.Writer) error {
	rc, err := s.ex.cli.ContainerLogs(ctx, svc.id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: tail})
	if err != nil {
		return s.ex.daemonError(fmt.Errorf("read log of service %s: %w", svc.Name, err))
	}
	defer rc.Close()
	if _, err := stdcopy.StdCopy(w, w, rc); err != nil {
		return fmt.Errorf("read log of service %s: %w", svc.Name, err)
	}
	return nil
}

// WatchServices implements executor.ServiceRunner: it looks at the
// service containers every second until one has ended.
func (s *Session) WatchServices(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		for _, svc := range s.services {
			if why, ended := s.serviceEnded(ctx, svc); ended && ctx.Err() == nil {
				return &executor.ServiceError{Service: svc.Name, Why: "ended while the run went on: " + why, Tail: s.serviceTail(ctx, svc)}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// ServiceLog implements executor.ServiceRunner.
func (s *Session) ServiceLog(ctx context.Context, name string, w io.Writer) error {
	for _, svc := range s.services {
		if svc.Name == name {
			return s.serviceLog(ctx, svc, "all", w)
		}
	}
	return fmt.Errorf("no service %s in this run", name)
}

// execIn runs cmd in the container id and returns its exit code and
// output (at most 1 MiB).
func (s *Session) execIn(ctx context.Context, id string, cmd []string) (int, string, error) {
	ex, err := s.ex.cli.ExecCreate(ctx, id, client.ExecCreateOptions{AttachStdout: true, AttachStderr: true, Cmd: cmd})
	if err != nil {
		return 0, "", s.ex.daemonError(fmt.Errorf("create exec: %w", err))
	}
	s.mu.Lock()
	s.execs = append(s.execs, ex.ID)
	s.mu.Unlock()
	att, err := s.ex.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return 0, "", s.ex.daemonError(fmt.Errorf("start exec: %w", err))
	}
	defer att.Close()
	stop := context.AfterFunc(ctx, func() { att.Close() })
	defer stop()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, io.Discard, io.LimitReader(att.Reader, 1<<20)); err != nil {
		return 0, "", err
	}
	st, err := s.ex.inspectExec(ctx, ex.ID)
	if err != nil {
		return 0, "", err
	}
	if st.Running || st.ExitCode == nil {
		return 0, "", fmt.Errorf("exec in %s: no exit code", id)
	}
	return *st.ExitCode, out.String(), nil
}

var _ executor.ServiceRunner = (*Session)(nil)
