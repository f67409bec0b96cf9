// Package fakeexec is an executor for tests: its sessions live in
// memory, and each step's output, exit and end are scripted, so the run
// engine and the daemon can be driven through starts, failures,
// cancellations and handovers without a process, a container or a
// cluster. It resumes sessions (executor.Resumer), releases their
// streams (executor.Releaser) and keeps a ledger of their steps
// (executor.StepLedger).
package fakeexec

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"sort"
	"strings"
	"sync"

	"knotless.dev/run/internal/executor"
)

// Name is the fake executor's name.
const Name = "fake"

// Step is what a step does: it writes Output (from the offset it is
// followed at), then, when Gate is set, waits for Gate to close (or for
// the follower's context to end), and exits with Code, or fails with Err.
type Step struct {
	Output string
	Code   int
	Gate   <-chan struct{}
	Err    error
}

// Executor is the fake executor. Script, when set, says what the step
// id (1, 2, ...) of run does; unset, every step writes nothing and
// succeeds. Outputs are the files every session's outputs directory
// holds, by slash-separated path.
type Executor struct {
	Script  func(runID, id string) Step
	Outputs map[string]string
	// StartErr, SweepErr and ResumeErr, when set, are returned by Start,
	// Sweep and Resume; PutErr by a session's Put; StopErr by a session's
	// Stop, which then leaves the session as it was (a Job that could not
	// be deleted). They are set before use, SweepErr also later
	// (SetSweepErr).
	StartErr, SweepErr, ResumeErr, PutErr, StopErr error
	// StopGate, when set, holds every session's Stop until it is closed
	// or Stop's context ends (then Stop fails with the context's error).
	StopGate <-chan struct{}
	// OnStart, when set, is told of every Start as it is called;
	// StartGate, when set, holds every Start until it is closed or its
	// context ends (then Start fails with the context's error, and makes
	// no session).
	OnStart   func(executor.Spec)
	StartGate <-chan struct{}

	mu       sync.Mutex
	sessions map[string]*Session // by run ID
	swept    [][]string
}

var (
	_ executor.Executor   = (*Executor)(nil)
	_ executor.Resumer    = (*Executor)(nil)
	_ executor.Releaser   = (*Session)(nil)
	_ executor.StepLedger = (*Session)(nil)
)

// Name implements executor.Executor.
func (e *Executor) Name() string { return Name }

// Start implements executor.Executor.
func (e *Executor) Start(ctx context.Context, spec executor.Spec) (executor.Session, error) {
	if e.OnStart != nil {
		e.OnStart(spec)
	}
	if e.StartGate != nil {
		select {
		case <-e.StartGate:
		case <-ctx.Done():
			return nil, fmt.Errorf("start %s: %w", spec.RunID, ctx.Err())
		}
	}
	if e.StartErr != nil {
		return nil, e.StartErr
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sessions == nil {
		e.sessions = map[string]*Session{}
	}
	if old := e.sessions[spec.RunID]; old != nil && !old.stopped {
		// Named from the run id, as the pod executors' objects are.
		return nil, fmt.Errorf("start %s: %w", spec.RunID, executor.ErrRunExists)
	}
	s := &Session{e: e, spec: spec, started: map[string][]byte{}}
	e.sessions[spec.RunID] = s
	return s, nil
}

// Sweep implements executor.Executor: it removes the stopped sessions'
// memory of every run not in keep and returns the refs of the sessions
// that were not stopped.
func (e *Executor) Sweep(_ context.Context, keep []string) ([]executor.Ref, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.SweepErr != nil {
		return nil, e.SweepErr
	}
	e.swept = append(e.swept, append([]string(nil), keep...))
	var removed []executor.Ref
	for id, s := range e.sessions {
		if contains(keep, id) {
			continue
		}
		if !s.stopped {
			removed = append(removed, s.Ref())
			s.stopped = true
		}
		delete(e.sessions, id)
	}
	sort.Slice(removed, func(i, j int) bool { return removed[i].Name < removed[j].Name })
	return removed, nil
}

// SetSweepErr sets SweepErr while the executor is in use.
func (e *Executor) SetSweepErr(err error) {
	e.mu.Lock()
	e.SweepErr = err
	e.mu.Unlock()
}

// Resume implements executor.Resumer.
func (e *Executor) Resume(_ context.Context, ref executor.Ref) (executor.Session, error) {
	if e.ResumeErr != nil {
		return nil, e.ResumeErr
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.sessions[ref.RunID]
	if !ok || s.stopped {
		return nil, fmt.Errorf("resume %s: no such session", ref)
	}
	return s, nil
}

// Session returns the session of a run, nil when there is none.
func (e *Executor) Session(runID string) *Session {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sessions[runID]
}

// Running lists the runs whose sessions are not stopped.
func (e *Executor) Running() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for id, s := range e.sessions {
		if !s.stopped {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// Swept lists the keep lists Sweep was called with.
func (e *Executor) Swept() [][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([][]string(nil), e.swept...)
}

func (e *Executor) step(runID, id string) Step {
	if e.Script == nil {
		return Step{}
	}
	return e.Script(runID, id)
}

// Session is one fake session.
type Session struct {
	e    *Executor
	spec executor.Spec

	// guarded by e.mu
	started  map[string][]byte // payload by step id
	ended    map[string]int    // exit code by step id, once followed to its end
	dropped  map[string]bool   // steps whose output and exit the session let go of
	killed   []string
	received map[string]string // the regular files put, by path
	released int
	stopped  bool
	stops    int
}

// Ref implements executor.Session.
func (s *Session) Ref() executor.Ref {
	return executor.Ref{Executor: Name, RunID: s.spec.RunID, Name: "fake-" + s.spec.RunID}
}

// Dirs implements executor.Session.
func (s *Session) Dirs() executor.Dirs { return executor.PodDirs() }

// Spec is what the session was started from.
func (s *Session) Spec() executor.Spec { return s.spec }

// Put implements executor.Session: it reads the tar stream and keeps
// its regular files (Received).
func (s *Session) Put(_ context.Context, dir string, r io.Reader) error {
	if s.e.PutErr != nil {
		return s.e.PutErr
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var data strings.Builder
		if _, err := io.Copy(&data, tr); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			s.e.mu.Lock()
			if s.received == nil {
				s.received = map[string]string{}
			}
			s.received[path.Join(dir, h.Name)] = data.String()
			s.e.mu.Unlock()
		}
	}
}

// Received are the regular files put into the session, by path (the
// directory put to joined with the name in the stream).
func (s *Session) Received() map[string]string {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return maps.Clone(s.received)
}

// Get implements executor.Session: the outputs directory holds the
// executor's Outputs, every other directory nothing.
func (s *Session) Get(_ context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	if dir == s.Dirs().Outputs {
		names := make([]string, 0, len(s.e.Outputs))
		for n := range s.e.Outputs {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			data := s.e.Outputs[n]
			if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
				return err
			}
			if _, err := io.WriteString(tw, data); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// StartStep implements executor.Session.
func (s *Session) StartStep(_ context.Context, id string, payload []byte) error {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	if s.stopped {
		return errors.New("session stopped")
	}
	if _, ok := s.started[id]; ok {
		return fmt.Errorf("step %s started twice", id)
	}
	s.started[id] = payload
	return nil
}

// FollowStep implements executor.Session.
func (s *Session) FollowStep(ctx context.Context, id string, offset int64, out io.Writer) (executor.Exit, error) {
	s.e.mu.Lock()
	_, ok := s.started[id]
	s.e.mu.Unlock()
	if !ok {
		return executor.Exit{}, fmt.Errorf("step %s not started", id)
	}
	s.e.mu.Lock()
	dropped := s.dropped[id]
	s.e.mu.Unlock()
	if dropped {
		return executor.Exit{}, executor.ErrExitUnknown
	}
	st := s.e.step(s.spec.RunID, id)
	if offset < int64(len(st.Output)) {
		if _, err := io.WriteString(out, st.Output[offset:]); err != nil {
			return executor.Exit{}, err
		}
	}
	if st.Gate != nil {
		select {
		case <-st.Gate:
		case <-ctx.Done():
			return executor.Exit{}, ctx.Err()
		}
	}
	if st.Err != nil {
		return executor.Exit{}, st.Err
	}
	s.e.mu.Lock()
	if s.ended == nil {
		s.ended = map[string]int{}
	}
	s.ended[id] = st.Code
	s.e.mu.Unlock()
	return executor.Exit{Code: st.Code}, nil
}

// Ledger implements executor.StepLedger: the steps started, with the
// exit of those followed to their end.
func (s *Session) Ledger(context.Context) (map[string]executor.StepRecord, error) {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	l := map[string]executor.StepRecord{}
	for id := range s.started {
		var r executor.StepRecord
		if code, ok := s.ended[id]; ok {
			r.Exit = &code
		}
		l[id] = r
	}
	return l, nil
}

// Drop lets go of step id's output and exit, as a pod does once a
// follower acknowledged them: following it again fails with
// executor.ErrExitUnknown; the ledger keeps its exit.
func (s *Session) Drop(id string) {
	s.e.mu.Lock()
	if s.dropped == nil {
		s.dropped = map[string]bool{}
	}
	s.dropped[id] = true
	s.e.mu.Unlock()
}

// Payload returns the payload step id was started with.
func (s *Session) Payload(id string) ([]byte, bool) {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	p, ok := s.started[id]
	return p, ok
}

// KillStep implements executor.Session.
func (s *Session) KillStep(_ context.Context, id string) error {
	s.e.mu.Lock()
	s.killed = append(s.killed, id)
	s.e.mu.Unlock()
	return nil
}

// Killed lists the steps killed.
func (s *Session) Killed() []string {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return append([]string(nil), s.killed...)
}

// Release implements executor.Releaser.
func (s *Session) Release() {
	s.e.mu.Lock()
	s.released++
	s.e.mu.Unlock()
}

// Stop implements executor.Session.
func (s *Session) Stop(ctx context.Context) error {
	s.e.mu.Lock()
	s.stops++
	s.e.mu.Unlock()
	if s.e.StopGate != nil {
		select {
		case <-s.e.StopGate:
		case <-ctx.Done():
			return fmt.Errorf("stop %s: %w", s.Ref(), ctx.Err())
		}
	}
	if s.e.StopErr != nil {
		return s.e.StopErr
	}
	s.e.mu.Lock()
	s.stopped = true
	s.e.mu.Unlock()
	return nil
}

// Stops is how many times Stop was called, failed or not.
func (s *Session) Stops() int {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.stops
}

// Stopped reports whether the session was stopped.
func (s *Session) Stopped() bool {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.stopped
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
