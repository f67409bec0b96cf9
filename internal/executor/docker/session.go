package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/spool"
	"knotless.dev/run/internal/lib/tarstream"
)

// Session is one run's container, network and volumes.
type Session struct {
	ex    *Executor
	id    string // the container's id
	netID string // the run's own network, when it has one
	ref   executor.Ref
	names names
	keep  bool
	log   *slog.Logger
	quit  chan struct{} // closed by Stop

	reapMu sync.Mutex // one reaper at a time

	mu      sync.Mutex
	steps   map[string]*step
	execs   []string // every exec made, for tests
	stopped bool

	// services are the run's service containers, in the order made.
	services []*service
	// stepCtrs are the containers of the steps with images of their
	// own, by step id (their ids; one per image).
	stepCtrs map[string]string
}

// step is one exec of the launcher and what it wrote.
type step struct {
	exec string
	ctr  string // the id of the container it runs in
	conn client.HijackedResponse
	out  *spool.Spool
	// sidKnown is closed when sid is known, or when the step ended
	// without telling it (sid stays 0).
	sidKnown chan struct{}
	sid      int
	done     chan struct{} // closed when exit and err are final
	exit     executor.Exit
	err      error
	// killed is set by KillStep: an end by a signal is its.
	killed atomic.Bool
}

// Ref implements executor.Session.
func (s *Session) Ref() executor.Ref { return s.ref }

// Dirs implements executor.Session.
func (s *Session) Dirs() executor.Dirs { return executor.PodDirs() }

// Put implements executor.Session: it checks the stream entry by entry
// and copies it into the container with the Engine API.
func (s *Session) Put(ctx context.Context, dir string, r io.Reader) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	if err := s.ensureDir(ctx, dir); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	relayed := make(chan error, 1)
	start := time.Now()
	counted := &tarstream.CountingReader{R: r}
	go func() {
		err := relayIn(ctx, counted, pw, s.ex.cfg.Limits)
		pw.CloseWithError(err)
		relayed <- err
	}()
	_, err := s.ex.cli.CopyToContainer(ctx, s.id, client.CopyToContainerOptions{DestinationPath: dir, Content: pr})
	pr.CloseWithError(errCopyEnded)
	// The relay's own error (a refused entry, the size limit) says more
	// than the request's; the request's says more than a relay cut off.
	if rerr := <-relayed; rerr != nil && (err == nil || !errors.Is(rerr, errCopyEnded)) {
		return fmt.Errorf("put %s: %w", dir, rerr)
	}
	if err != nil {
		return s.ex.daemonError(fmt.Errorf("put %s: %w", dir, err))
	}
	took := time.Since(start)
	s.ex.obs.Transferred(executor.DirectionIn, counted.N, took)
	s.log.Info("transfer in", "dir", dir, "bytes", counted.N, "duration", took.Round(time.Millisecond))
	return nil
}

var errCopyEnded = errors.New("the copy into the container ended early")

// Get implements executor.Session. The daemon's archive names the
// directory itself as its top entry; Get renames every entry to be
// relative to the directory, as the other executors write it.
func (s *Session) Get(ctx context.Context, dir string, w io.Writer) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	start := time.Now()
	res, err := s.ex.cli.CopyFromContainer(ctx, s.id, client.CopyFromContainerOptions{SourcePath: dir})
	if err != nil {
		return s.ex.daemonError(fmt.Errorf("get %s: %w", dir, err))
	}
	defer res.Content.Close()
	if !res.Stat.Mode.IsDir() {
		return fmt.Errorf("get %s: not a directory in the container", dir)
	}
	counted := &tarstream.CountingWriter{W: w}
	if err := relayOut(ctx, res.Content, counted, res.Stat.Name, s.ex.cfg.Limits); err != nil {
		return fmt.Errorf("get %s: %w", dir, err)
	}
	took := time.Since(start)
	s.ex.obs.Transferred(executor.DirectionOut, counted.N, took)
	s.log.Info("transfer out", "dir", dir, "bytes", counted.N, "duration", took.Round(time.Millisecond))
	return nil
}

func checkDir(dir string) error {
	if !strings.HasPrefix(dir, "/") || dir == "/" || strings.Contains("/"+dir+"/", "/../") {
		return fmt.Errorf("path %q is not an absolute directory below / in the container", dir)
	}
	return nil
}

// StartStep starts the launcher as an exec, attached, and sends the
// payload on its stdin.
func (s *Session) StartStep(ctx context.Context, id string, payload []byte) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return fmt.Errorf("start step %s: session %s is stopped", id, s.names.container)
	}
	if _, dup := s.steps[id]; dup {
		s.mu.Unlock()
		return fmt.Errorf("step %s already started", id)
	}
	s.mu.Unlock()

	// No reaper runs while the launcher starts: until it has a session
	// of its own (sidKnown), its processes are of no live session, which
	// a reaper kills (an earlier step's, killed at a cancel, may still be
	// at it), and runc's exec then fails ("broken pipe").
	s.reapMu.Lock()
	ctr := s.stepContainer(id)
	ex, err := s.ex.cli.ExecCreate(ctx, ctr, client.ExecCreateOptions{
		AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Cmd: []string{"sh", "-c", launcher},
	})
	if err != nil {
		s.reapMu.Unlock()
		return s.ex.daemonError(fmt.Errorf("create exec for step %s: %w", id, err))
	}
	att, err := s.ex.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		s.reapMu.Unlock()
		return s.ex.daemonError(fmt.Errorf("start exec for step %s: %w", id, err))
	}
	st := &step{exec: ex.ID, ctr: ctr, conn: att.HijackedResponse, out: spool.New(), sidKnown: make(chan struct{}), done: make(chan struct{})}
	go func() {
		<-st.sidKnown // closed once the session is known, or the step ended
		s.reapMu.Unlock()
	}()
	s.mu.Lock()
	s.steps[id] = st
	s.execs = append(s.execs, ex.ID)
	s.mu.Unlock()
	go s.follow(st)

	stop := context.AfterFunc(ctx, func() { st.conn.Close() })
	_, werr := st.conn.Conn.Write(payload)
	if werr == nil {
		werr = st.conn.CloseWrite()
	}
	if !stop() {
		werr = errors.Join(werr, ctx.Err())
	}
	if werr != nil {
		st.conn.Close()
		return fmt.Errorf("send payload of step %s: %w", id, werr)
	}
	return nil
}

// follow owns a step's stream: it copies the output into the spool and
// learns the exit status. The launcher has killed what the step left
// before its exec ends, unless it was killed itself.
func (s *Session) follow(st *step) {
	defer close(st.done)
	sw := &sidWriter{st: st, w: st.out}
	_, cerr := stdcopy.StdCopy(sw, st.out, st.conn.Reader)
	st.conn.Close()
	sw.finish()
	if cerr != nil {
		s.log.Warn("step output stream broke", "exec", st.exec, "err", cerr)
	}
	ctx, cancel := s.untilStop()
	defer cancel()
	st.exit, st.err = s.exitOf(ctx, st.exec)
	if (st.err != nil || st.exit.Code >= 128) && !st.killed.Load() && !s.isStopped() {
		if lost := s.lostCause(ctx, st.ctr, st.err); lost != nil {
			// Nothing is left in a container that is gone or stopped to
			// reap.
			st.exit, st.err = executor.Exit{}, lost
			_ = st.out.Close()
			return
		}
	}
	// A launcher that died of a signal (KillStep, or a step that killed
	// it) or never told its session may not have cleaned up: the reaper
	// does it from outside. The step's session has no live process now,
	// so it goes whatever id is named.
	if (st.err == nil && st.exit.Code >= 128 || st.sid <= 1) && !s.isStopped() {
		sid := "none"
		if st.sid > 1 {
			sid = strconv.Itoa(st.sid)
		}
		if err := s.reap(ctx, st.ctr, sid); err != nil && st.err == nil {
			st.err = fmt.Errorf("kill the processes the step left: %w", err)
		}
	}
	_ = st.out.Close()
}

// lostCause says how a step that died of a signal, or whose end could
// not be learned (err), was lost to the infrastructure: its container
// removed, or stopped (the docker daemon restarted, someone stopped or
// killed it) under it, or the docker daemon is not reachable. Nil when the container still runs after
// lostSettle (the step's own end), was killed by its memory bound (the
// workflow's), or cannot be inspected. The container is asked a few
// times: the exec of a container being removed dies before the
// container is said to have stopped.
func (s *Session) lostCause(ctx context.Context, ctr string, err error) error {
	suffix := ""
	if err != nil {
		suffix = ": " + err.Error()
	}
	deadline := time.Now().Add(lostSettle)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		in, ierr := s.ex.cli.ContainerInspect(ctx, ctr, client.ContainerInspectOptions{})
		switch {
		case cerrdefs.IsNotFound(ierr):
			return executor.Lost(fmt.Errorf("container %s was removed while the step ran%s", ctr, suffix))
		case ierr != nil && s.ex.daemonError(ierr) != ierr:
			// The daemon is gone (crashed, restarting): its answer wraps
			// ierr as not reachable.
			return executor.Lost(fmt.Errorf("the docker daemon went away while the step ran%s", suffixOr(suffix, s.ex.daemonError(ierr))))
		case ierr != nil:
			return nil
		}
		st := in.Container.State
		switch {
		case st == nil || st.OOMKilled:
			return nil
		case !st.Running || st.Restarting:
			return executor.Lost(fmt.Errorf("container %s stopped while the step ran (%s, exit %d)%s", ctr, st.Status, st.ExitCode, suffix))
		case time.Now().After(deadline):
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// suffixOr is suffix, or ": "+err when suffix is empty.
func suffixOr(suffix string, err error) string {
	if suffix != "" {
		return suffix
	}
	return ": " + err.Error()
}

// lostSettle bounds how long a step's end waits for its container's
// state to say whether the container went under it.
const lostSettle = 3 * time.Second

// exitOf reads an ended exec's exit status. The stream can end before
// the exec does (a broken connection): then it waits for the exec.
func (s *Session) exitOf(ctx context.Context, execID string) (executor.Exit, error) {
	var lastErr error
	for failures, wait := 0, 50*time.Millisecond; ; {
		st, err := s.ex.inspectExec(ctx, execID)
		switch {
		case err != nil:
			lastErr = err
			failures++
			if failures >= 3 || ctx.Err() != nil {
				return executor.Exit{}, fmt.Errorf("%w: %w", executor.ErrExitUnknown, s.ex.daemonError(lastErr))
			}
		case !st.Running && st.ExitCode == nil:
			return executor.Exit{}, fmt.Errorf("%w: the exec ended without an exit code", executor.ErrExitUnknown)
		case !st.Running:
			return executor.Exit{Code: *st.ExitCode}, nil
		}
		select {
		case <-ctx.Done():
			return executor.Exit{}, fmt.Errorf("%w: %w", executor.ErrExitUnknown, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// FollowStep implements executor.Session.
func (s *Session) FollowStep(ctx context.Context, id string, offset int64, out io.Writer) (executor.Exit, error) {
	st, err := s.step(id)
	if err != nil {
		return executor.Exit{}, err
	}
	if err := st.out.FollowUntil(ctx, offset, out, st.done); err != nil {
		return executor.Exit{}, err
	}
	return st.exit, st.err
}

// KillStep kills the step's session and every process of no live
// session. Docker has no call that kills an exec: the reaper does it
// from inside.
func (s *Session) KillStep(ctx context.Context, id string) error {
	st, err := s.step(id)
	if err != nil {
		return err
	}
	select {
	case <-st.sidKnown:
	case <-st.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("kill step %s: %w", id, ctx.Err())
	}
	if st.sid <= 1 {
		return fmt.Errorf("kill step %s: its session is unknown", id)
	}
	st.killed.Store(true) // its end by a signal is this kill's, not the infrastructure's
	if err := s.reap(ctx, st.ctr, strconv.Itoa(st.sid)); err != nil {
		return fmt.Errorf("kill step %s: %w", id, err)
	}
	return nil
}

func (s *Session) step(id string) (*step, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.steps[id]
	if !ok {
		return nil, fmt.Errorf("no step %s in session %s", id, s.names.container)
	}
	return st, nil
}

func (s *Session) isStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// untilStop returns a context that ends when Stop is called.
func (s *Session) untilStop() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-s.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// reap runs the reaper in the container and waits for it.
func (s *Session) reap(ctx context.Context, ctr, sid string) error {
	s.reapMu.Lock()
	defer s.reapMu.Unlock()
	ex, err := s.ex.cli.ExecCreate(ctx, ctr, client.ExecCreateOptions{
		AttachStdout: true, AttachStderr: true,
		Cmd: []string{"sh", "-c", reapScript, "knotless-reaper", sid},
	})
	if err != nil {
		return s.ex.daemonError(fmt.Errorf("create reaper exec: %w", err))
	}
	s.mu.Lock()
	s.execs = append(s.execs, ex.ID)
	s.mu.Unlock()
	att, err := s.ex.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return s.ex.daemonError(fmt.Errorf("start reaper exec: %w", err))
	}
	defer att.Close()
	stop := context.AfterFunc(ctx, func() { att.Close() })
	defer stop()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, io.LimitReader(att.Reader, 64<<10)); err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	if strings.TrimSpace(out.String()) != "reaped" {
		return fmt.Errorf("reaper: %q", strings.TrimSpace(out.String()))
	}
	return nil
}

// Stop kills every step, waits for the steps' streams to end, and
// removes the container, its network and its volumes unless the session
// is kept. It is safe to call more than once.
func (s *Session) Stop(ctx context.Context) error {
	s.mu.Lock()
	if !s.stopped {
		s.stopped = true
		close(s.quit)
	}
	var running []*step
	for _, st := range s.steps {
		select {
		case <-st.done:
		default:
			running = append(running, st)
		}
	}
	s.mu.Unlock()

	var errs []error
	if s.keep && len(running) > 0 {
		for _, ctr := range append([]string{s.id}, s.stepCtrIDs()...) {
			if err := s.reap(ctx, ctr, "all"); err != nil {
				errs = append(errs, fmt.Errorf("kill steps: %w", err))
			}
		}
	}
	if !s.keep {
		if err := s.removeContainer(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, st := range running {
		st.conn.Close()
		select {
		case <-st.done:
		case <-ctx.Done():
			return errors.Join(append(errs, fmt.Errorf("stop session %s: %w", s.names.container, ctx.Err()))...)
		}
	}
	if s.keep {
		s.log.Info("container kept", "container", s.names.container)
		return errors.Join(errs...)
	}
	if err := s.remove(ctx); err != nil {
		s.ex.cleanupFailed(s.log, "remove run", err)
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		s.log.Info("container removed", "container", s.names.container)
	}
	return errors.Join(errs...)
}

func (s *Session) removeContainer(ctx context.Context) error {
	if s.id == "" {
		return nil
	}
	_, err := s.ex.cli.ContainerRemove(ctx, s.id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return s.ex.daemonError(fmt.Errorf("remove container %s: %w", s.names.container, err))
	}
	return nil
}

// remove removes whatever of the run's container, network and volumes
// exists. Objects are addressed by id where the session made them, so
// that nothing of another run with a clashing name is touched.
func (s *Session) remove(ctx context.Context) error {
	var errs []error
	// The containers beside the run's first (its steps' of their own
	// images, its services'): they are in its network namespace.
	ids := append(s.names.beside, s.stepCtrIDs()...)
	for _, svc := range s.services {
		ids = append(ids, svc.id)
	}
	for _, id := range ids {
		if _, err := s.ex.cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, s.ex.daemonError(fmt.Errorf("remove service container %s: %w", id, err)))
		}
	}
	if err := s.removeContainer(ctx); err != nil {
		errs = append(errs, err)
	}
	if s.netID != "" {
		if _, err := s.ex.cli.NetworkRemove(ctx, s.netID, client.NetworkRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, s.ex.daemonError(fmt.Errorf("remove network %s: %w", s.names.network, err)))
		}
	}
	for _, v := range s.names.volumes {
		if _, err := s.ex.cli.VolumeRemove(ctx, v, client.VolumeRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, s.ex.daemonError(fmt.Errorf("remove volume %s: %w", v, err)))
		}
	}
	return errors.Join(errs...)
}

// sidWriter takes the launcher's first line off the step's stdout and
// passes everything after it on.
type sidWriter struct {
	st   *step
	w    io.Writer
	line []byte
	seen bool
}

func (w *sidWriter) Write(p []byte) (int, error) {
	if w.seen {
		return w.w.Write(p)
	}
	n := len(p)
	w.line = append(w.line, p...)
	i := bytes.IndexByte(w.line, '\n')
	if i < 0 && len(w.line) < 128 {
		return n, nil
	}
	w.seen = true
	rest := w.line
	if i >= 0 {
		if f := strings.Fields(string(w.line[:i])); len(f) == 2 && f[0] == sidMarker {
			w.st.sid, _ = strconv.Atoi(f[1])
			rest = w.line[i+1:]
		}
	}
	close(w.st.sidKnown)
	w.line = nil
	if len(rest) > 0 {
		if _, err := w.w.Write(rest); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// finish passes on a partial first line and marks the session id as
// known (0 when the launcher never told it).
func (w *sidWriter) finish() {
	if w.seen {
		return
	}
	w.seen = true
	close(w.st.sidKnown)
	if len(w.line) > 0 {
		_, _ = w.w.Write(w.line)
	}
}

// execState is the part of an exec's inspect that the client's own
// ExecInspect flattens: a missing exit code must stay missing.
type execState struct {
	Running  bool
	ExitCode *int
}

func (e *Executor) inspectExec(ctx context.Context, id string) (execState, error) {
	path := "/exec/" + id + "/json"
	if v := e.cli.ClientVersion(); v != "" {
		path = "/v" + v + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+client.DummyHost+path, nil)
	if err != nil {
		return execState{}, err
	}
	resp, err := e.raw.Do(req)
	if err != nil {
		return execState{}, fmt.Errorf("inspect exec %s: %w", id, err)
	}
	defer drain(resp.Body)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return execState{}, fmt.Errorf("inspect exec %s: %s: %s", id, resp.Status, bytes.TrimSpace(msg))
	}
	var st execState
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return execState{}, fmt.Errorf("inspect exec %s: %w", id, err)
	}
	return st, nil
}
