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
	"knotless.dev/run/internal/tarstream"
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

// drainGrace is how long output may still arrive after a step's shell
// has exited and its session was killed.
const drainGrace = 2 * time.Second

// Start creates the run's directory tree.
func (e *Executor) Start(ctx context.Context, spec executor.Spec) (executor.Session, error) {
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
	for _, d := range []string{s.dirs.Work, s.dirs.Steps, s.dirs.Outputs, filepath.Join(root, "home"), filepath.Join(root, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, errors.Join(fmt.Errorf("create %s: %w", d, err), os.RemoveAll(root))
		}
	}
	return s, nil
}

// Sweep removes run directories under the root whose run is not in keep.
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

// killSession sends SIGKILL to every process whose session id is sid:
// the step's shell and everything it started that did not leave its
// session.
func killSession(sid int) {
	// The leader first, so it cannot start more while we scan.
	_ = syscall.Kill(-sid, syscall.SIGKILL)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if procSession(pid) == sid {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// procSession reads the session id of pid from /proc/<pid>/stat.
func procSession(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// The command name may hold spaces and parentheses: fields start
	// after the last ')'. Then: state ppid pgrp session.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return -1
	}
	sid, err := strconv.Atoi(f[3])
	if err != nil {
		return -1
	}
	return sid
}
