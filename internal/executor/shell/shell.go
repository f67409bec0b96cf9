// Package shell is the executor that runs steps as local processes, each
// run in its own temporary directory tree. It isolates nothing: it is an
// explicit fallback for trusted code on a host without a cluster.
package shell

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/spool"
	"knotless.dev/run/internal/lib/tarstream"
)

// Name is the executor's name.
const Name = "shell"

// Config configures the shell executor.
type Config struct {
	// Root holds one directory per run; it defaults to the system's
	// temporary directory.
	Root string
	// Path is the PATH steps get; empty means a conventional one. It is
	// the only thing of the runner's environment a step sees.
	Path string
	// Limits bound every transfer.
	Limits tarstream.Limits
	// Runner is the runner's id (its DID): it is written into each run
	// directory, and Sweep removes only directories that carry it.
	Runner string
	Logger *slog.Logger
}

// Executor runs steps as child processes of the runner.
type Executor struct {
	cfg Config
}

// New returns a shell executor.
func New(cfg Config) *Executor {
	if cfg.Root == "" {
		cfg.Root = os.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Path == "" {
		cfg.Path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
	}
	return &Executor{cfg: cfg}
}

// Name implements executor.Executor.
func (e *Executor) Name() string { return Name }

const dirPrefix = "knotless-run-"

// Files in a run directory that let a later process sweep it: the id of
// the runner that made it, and one line "SID STARTTIME" per step started
// (its session id and the leader's start time, from /proc).
const (
	runnerFile = ".knotless-runner"
	stepsFile  = ".knotless-steps"
)

// drainGrace is how long output may still arrive after a step's shell
// has exited and its session was killed.
const drainGrace = 2 * time.Second

// Start creates the run's directory tree.
func (e *Executor) Start(ctx context.Context, spec executor.Spec) (executor.Session, error) {
	if err := errors.Join(executor.NoServices(Name, spec), executor.NoStepImages(Name, spec)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(e.cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("create shell root %s: %w", e.cfg.Root, err)
	}
	root, err := os.MkdirTemp(e.cfg.Root, dirPrefix+spec.RunID+"-")
	if err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	s := &Session{
		ref:   executor.Ref{Executor: Name, RunID: spec.RunID, Name: root},
		root:  root,
		path:  e.cfg.Path,
		keep:  spec.Keep,
		lim:   e.cfg.Limits,
		steps: map[string]*process{},
	}
	s.dirs = executor.Dirs{Work: filepath.Join(root, "work"), Steps: filepath.Join(root, "steps"), Outputs: filepath.Join(root, "outputs")}
	if err := os.WriteFile(filepath.Join(root, runnerFile), []byte(e.cfg.Runner), 0o600); err != nil {
		return nil, errors.Join(fmt.Errorf("create run directory: %w", err), os.RemoveAll(root))
	}
	for _, d := range []string{s.dirs.Work, s.dirs.Steps, s.dirs.Outputs, filepath.Join(root, "home"), filepath.Join(root, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, errors.Join(fmt.Errorf("create %s: %w", d, err), os.RemoveAll(root))
		}
	}
	return s, nil
}

// Sweep removes this runner's run directories under the root whose run
// is not in keep, after killing what their steps left running. A
// directory without this runner's id in it is someone else's and stays.
func (e *Executor) Sweep(ctx context.Context, keep []string) ([]executor.Ref, error) {
	entries, err := os.ReadDir(e.cfg.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sweep %s: %w", e.cfg.Root, err)
	}
	var swept []executor.Ref
	var errs []error
	for _, ent := range entries {
		name := ent.Name()
		if !ent.IsDir() || !strings.HasPrefix(name, dirPrefix) || kept(name, keep) {
			continue
		}
		dir := filepath.Join(e.cfg.Root, name)
		if owner, err := os.ReadFile(filepath.Join(dir, runnerFile)); err != nil || string(owner) != e.cfg.Runner {
			continue
		}
		killRecorded(dir, e.cfg.Logger)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		swept = append(swept, executor.Ref{Executor: Name, Name: dir})
	}
	return swept, errors.Join(errs...)
}

func kept(dirName string, keep []string) bool {
	for _, id := range keep {
		if strings.HasPrefix(dirName, dirPrefix+id+"-") {
			return true
		}
	}
	return false
}

// Session is one run's directory tree and its step processes.
type Session struct {
	ref  executor.Ref
	root string
	path string
	dirs executor.Dirs
	keep bool
	lim  tarstream.Limits

	mu    sync.Mutex
	steps map[string]*process
}

type process struct {
	cmd  *exec.Cmd
	out  *spool.Spool
	done chan struct{} // closed when the process is reaped and output drained
	exit executor.Exit
	err  error
}

// Ref implements executor.Session.
func (s *Session) Ref() executor.Ref { return s.ref }

// Dirs implements executor.Session.
func (s *Session) Dirs() executor.Dirs { return s.dirs }

// inside maps dir to a path inside the session and refuses any other.
func (s *Session) inside(dir string) (string, error) {
	clean := filepath.Clean(dir)
	if rel, err := filepath.Rel(s.root, clean); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("path %s is outside the shell session %s", dir, s.root)
	}
	return clean, nil
}

// Put implements executor.Session.
func (s *Session) Put(ctx context.Context, dir string, r io.Reader) error {
	target, err := s.inside(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("put %s: %w", dir, err)
	}
	return tarstream.Unpack(ctx, r, target, s.lim)
}

// Get implements executor.Session.
func (s *Session) Get(ctx context.Context, dir string, w io.Writer) error {
	target, err := s.inside(dir)
	if err != nil {
		return err
	}
	return tarstream.Pack(ctx, target, w, s.lim)
}

// StartStep runs `sh -s` in a session of its own with payload on stdin.
// The environment is built from scratch so that nothing of the runner's
// own environment (its secrets among it) reaches the step.
func (s *Session) StartStep(ctx context.Context, id string, payload []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.steps[id]; dup {
		return fmt.Errorf("step %s already started", id)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("start step %s: %w", id, err)
	}
	cmd := exec.Command("/bin/sh", "-s")
	cmd.Dir = s.dirs.Work
	cmd.Env = []string{
		"PATH=" + s.path,
		"HOME=" + filepath.Join(s.root, "home"),
		"TMPDIR=" + filepath.Join(s.root, "tmp"),
		"LANG=C.UTF-8",
	}
	cmd.Stdin = strings.NewReader(string(payload))
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return fmt.Errorf("start step %s: %w", id, err)
	}
	pw.Close()
	if err := s.record(cmd.Process.Pid); err != nil {
		killSession(cmd.Process.Pid)
		_ = cmd.Wait()
		pr.Close()
		return fmt.Errorf("start step %s: %w", id, err)
	}
	p := &process{cmd: cmd, out: spool.New(), done: make(chan struct{})}
	s.steps[id] = p
	go p.run(pr)
	return nil
}

// run owns the step's process: it copies output, reaps the process, then
// kills what the step left in its session so the output pipe can close.
func (p *process) run(pr *os.File) {
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(p.out, pr)
	}()
	err := p.cmd.Wait()
	killSession(p.cmd.Process.Pid)
	// A process that left the step's session may still hold the pipe;
	// its later output is not the step's.
	select {
	case <-copied:
	case <-time.After(drainGrace):
	}
	pr.Close()
	<-copied
	_ = p.out.Close()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		p.exit.Code = ee.ExitCode()
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.exit.Code = 128 + int(ws.Signal())
		} else {
			p.err = fmt.Errorf("%w: %v", executor.ErrExitUnknown, err)
		}
	default:
		p.err = fmt.Errorf("%w: %v", executor.ErrExitUnknown, err)
	}
	close(p.done)
}

// FollowStep implements executor.Session.
func (s *Session) FollowStep(ctx context.Context, id string, offset int64, out io.Writer) (executor.Exit, error) {
	p, err := s.step(id)
	if err != nil {
		return executor.Exit{}, err
	}
	if err := p.out.FollowUntil(ctx, offset, out, p.done); err != nil {
		return executor.Exit{}, err
	}
	return p.exit, p.err
}

// KillStep kills every process in the step's session.
func (s *Session) KillStep(ctx context.Context, id string) error {
	p, err := s.step(id)
	if err != nil {
		return err
	}
	killSession(p.cmd.Process.Pid)
	return nil
}

func (s *Session) step(id string) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.steps[id]
	if !ok {
		return nil, fmt.Errorf("no step %s in session %s", id, s.root)
	}
	return p, nil
}

// Stop kills any step still going, waits for it, and removes the tree.
func (s *Session) Stop(ctx context.Context) error {
	s.mu.Lock()
	steps := make([]*process, 0, len(s.steps))
	for _, p := range s.steps {
		steps = append(steps, p)
	}
	s.mu.Unlock()
	for _, p := range steps {
		killSession(p.cmd.Process.Pid)
		select {
		case <-p.done:
		case <-ctx.Done():
			return fmt.Errorf("stop shell session %s: %w", s.root, ctx.Err())
		}
	}
	if s.keep {
		return nil
	}
	if err := os.RemoveAll(s.root); err != nil {
		return fmt.Errorf("remove %s: %w", s.root, err)
	}
	return nil
}

// record notes a step's session in the run directory, so that a sweep
// after a crash of this process can kill what the step left.
func (s *Session) record(sid int) error {
	f, err := os.OpenFile(filepath.Join(s.root, stepsFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%d %d\n", sid, procStartTime(sid))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// killRecorded kills the step sessions recorded in the run directory dir
// that are still the run's own. A session's id is its leader's pid, and
// the kernel does not hand that number out again while any process of
// the session lives; so when a process with that pid exists but started
// at another time than recorded, the session is gone and the number
// belongs to someone else: it is left alone.
func killRecorded(dir string, log *slog.Logger) {
	b, err := os.ReadFile(filepath.Join(dir, stepsFile))
	if err != nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var sid int
		var start int64
		if _, err := fmt.Sscanf(line, "%d %d", &sid, &start); err != nil || sid <= 1 {
			continue
		}
		if now := procStartTime(sid); now >= 0 && now != start {
			continue
		}
		log.Info("killing a step left by an earlier process", "dir", dir, "session", sid)
		killSession(sid)
	}
}

// killSession sends SIGKILL to every process whose session id is sid:
// the step's shell and everything it started that did not leave its
// session. It returns once none of them is alive (a zombie is not), or
// after killWait: a SIGKILL is delivered asynchronously, and a process
// forking at the moment of the scan shows up only in the next one.
func killSession(sid int) {
	deadline := time.Now().Add(killWait)
	for {
		// The leader's group first, so it cannot start more while we scan.
		_ = syscall.Kill(-sid, syscall.SIGKILL)
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		alive := false
		for _, ent := range entries {
			pid, err := strconv.Atoi(ent.Name())
			if err != nil || procSession(pid) != sid || procState(pid) == 'Z' {
				continue
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
			alive = true
		}
		if !alive || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killWait bounds how long killSession waits for a session to be gone.
const killWait = 5 * time.Second

// procState reads the state letter of pid from /proc/<pid>/stat ('R',
// 'S', 'Z', ...), or 0.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	j := strings.LastIndexByte(string(b), ')')
	if j < 0 || j+2 >= len(b) {
		return 0
	}
	return b[j+2]
}

// procSession reads the session id of pid from /proc/<pid>/stat.
func procSession(pid int) int {
	return int(procStat(pid, 3))
}

// procStartTime reads when pid started (clock ticks after boot) from
// /proc/<pid>/stat, or -1 when there is no such process.
func procStartTime(pid int) int64 {
	return procStat(pid, 19)
}

// procStat reads field i after the command name of /proc/<pid>/stat
// (0 is the state, 3 the session, 19 the start time), or -1.
func procStat(pid, i int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// The command name may hold spaces and parentheses: fields start
	// after the last ')'. Then: state ppid pgrp session.
	j := strings.LastIndexByte(string(b), ')')
	if j < 0 {
		return -1
	}
	f := strings.Fields(string(b[j+1:]))
	if len(f) <= i {
		return -1
	}
	v, err := strconv.ParseInt(f[i], 10, 64)
	if err != nil {
		return -1
	}
	return v
}
