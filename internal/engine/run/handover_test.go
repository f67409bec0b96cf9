package run

import (
	"archive/tar"
	"context"
	"io"
	"strings"
	"sync"
	"testing"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/workflow"
)

// cutExecutor runs one step whose output is out: the first session
// writes out[:cut] and then waits to be detached, a resumed session
// writes from the offset it is asked for to the end.
type cutExecutor struct {
	out     string
	cut     int
	reached chan struct{}
	once    sync.Once
	// failStep, when set, is a step that exits 1 at once, writing
	// nothing.
	failStep string
}

func (e *cutExecutor) Name() string { return "cut" }
func (e *cutExecutor) Start(context.Context, executor.Spec) (executor.Session, error) {
	return &cutSession{e: e}, nil
}
func (e *cutExecutor) Sweep(context.Context, []string) ([]executor.Ref, error) { return nil, nil }
func (e *cutExecutor) Resume(context.Context, executor.Ref) (executor.Session, error) {
	return &cutSession{e: e, resumed: true}, nil
}

type cutSession struct {
	e       *cutExecutor
	resumed bool
}

func (s *cutSession) Ref() executor.Ref { return executor.Ref{Executor: "cut", RunID: "r", Name: "s"} }
func (s *cutSession) Dirs() executor.Dirs {
	return executor.Dirs{Work: "/w", Steps: "/s", Outputs: "/o"}
}
func (s *cutSession) Release()                                        {}
func (s *cutSession) Stop(context.Context) error                      { return nil }
func (s *cutSession) KillStep(context.Context, string) error          { return nil }
func (s *cutSession) StartStep(context.Context, string, []byte) error { return nil }
func (s *cutSession) Put(_ context.Context, _ string, r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	return err
}
func (s *cutSession) Get(_ context.Context, _ string, w io.Writer) error {
	return tar.NewWriter(w).Close()
}
func (s *cutSession) FollowStep(ctx context.Context, id string, offset int64, out io.Writer) (executor.Exit, error) {
	if id == s.e.failStep {
		return executor.Exit{Code: 1}, nil
	}
	if s.resumed {
		_, err := io.WriteString(out, s.e.out[offset:])
		return executor.Exit{}, err
	}
	if _, err := io.WriteString(out, s.e.out[offset:s.e.cut]); err != nil {
		return executor.Exit{}, err
	}
	s.e.once.Do(func() { close(s.e.reached) })
	<-ctx.Done()
	return executor.Exit{}, ctx.Err()
}

// A secret the step prints across the handover: the stopping process
// must not log the half it holds back, and the successor must mask the
// whole value, so the log never shows either half in clear.
func TestHandoverDoesNotSplitASecret(t *testing.T) {
	t.Parallel()
	ex := &cutExecutor{out: "pw=hunter2 done\n", cut: len("pw=hun"), reached: make(chan struct{})}
	eng := New(Config{Executor: ex})
	detach := make(chan struct{})
	req := Request{
		RunID: "r",
		Workflow: &workflow.Workflow{Name: "w", Secrets: []string{"PW"},
			Steps: []workflow.Step{{Name: "s", Run: "true"}}},
		Checkout: t.TempDir(),
		Secrets:  map[string]string{"PW": "hunter2"},
		Trusted:  true,
		Detach:   detach,
	}
	go func() { <-ex.reached; close(detach) }()
	first := eng.Run(context.Background(), req)
	if first.Status != Detached || first.Handover == nil {
		t.Fatalf("first run: status %s, handover %v, want detached", first.Status, first.Handover)
	}
	req.Detach = nil
	res := eng.Adopt(context.Background(), req, *first.Handover, first.Log)
	if res.Status != Success {
		t.Fatalf("adopted run: status %s (%s), want success\n%s", res.Status, res.Error, res.Log)
	}
	log := string(res.Log)
	for _, half := range []string{"hun", "ter2", "hunter2"} {
		if strings.Contains(log, half) {
			t.Errorf("log shows %q in clear:\n%s", half, log)
		}
	}
	if !strings.Contains(log, "\n*** done\n") {
		t.Errorf("log lacks the masked rest %q:\n%s", "*** done", log)
	}
}

// A run handed over while a step after a failure runs (if: always())
// stays failed in the successor: the failure travels in the handover.
func TestHandoverKeepsAnEarlierFailure(t *testing.T) {
	t.Parallel()
	ex := &cutExecutor{out: "cleaning\n", cut: 1, reached: make(chan struct{}), failStep: "1"}
	eng := New(Config{Executor: ex})
	wf, err := workflow.Parse("w.yaml", []byte("on: push\nsteps:\n  - {name: bad, run: 'exit 1'}\n  - {name: clean, run: 'true', if: always()}\n"))
	if err != nil {
		t.Fatal(err)
	}
	detach := make(chan struct{})
	req := Request{RunID: "r", Workflow: wf, Checkout: t.TempDir(), Trusted: true, Detach: detach}
	go func() { <-ex.reached; close(detach) }()
	first := eng.Run(context.Background(), req)
	if first.Status != Detached || first.Handover == nil {
		t.Fatalf("first run: status %s, handover %v, want detached", first.Status, first.Handover)
	}
	if h := first.Handover; h.Step != 1 || h.Status != Failure || h.FailedStep != "bad" {
		t.Fatalf("handover at step %d, status %q, failed step %q; want step 1 (clean), failure, bad", h.Step, h.Status, h.FailedStep)
	}
	req.Detach = nil
	res := eng.Adopt(context.Background(), req, *first.Handover, first.Log)
	if res.Status != Failure || res.FailedStep != "bad" || res.Error != `step "bad" exited with code 1` {
		t.Errorf("adopted run: status %s, failed step %q, error %q; want failure, bad, its exit\n%s", res.Status, res.FailedStep, res.Error, res.Log)
	}
	if got := res.Steps[1].Status; got != Success {
		t.Errorf("clean: %s, want success", got)
	}
}

// After a cancel an if: always() step runs, unless the cancel's cause
// is the runner stopping (ErrStopped): the run starts again elsewhere.
func TestAlwaysAfterCancelUnlessStopping(t *testing.T) {
	t.Parallel()
	wf, err := workflow.Parse("w.yaml", []byte("on: push\nsteps:\n  - {name: long, run: 'sleep 300'}\n  - {name: clean, run: 'true', if: always()}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		cause error
		want  Status
	}{
		{"cancelled", nil, Failure}, // clean ran: its step exits 1 here
		{"runner stopping", ErrStopped, Skipped},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ex := &cutExecutor{out: "x", cut: 1, reached: make(chan struct{}), failStep: "2"}
			eng := New(Config{Executor: ex})
			ctx, cancel := context.WithCancelCause(context.Background())
			go func() { <-ex.reached; cancel(c.cause) }()
			res := eng.Run(ctx, Request{RunID: "r", Workflow: wf, Checkout: t.TempDir(), Trusted: true})
			if res.Status != Cancelled || res.Steps[0].Status != Cancelled {
				t.Fatalf("run %s, long %s; want both cancelled\n%s", res.Status, res.Steps[0].Status, res.Log)
			}
			if got := res.Steps[1].Status; got != c.want {
				t.Errorf("clean: %s, want %s\n%s", got, c.want, res.Log)
			}
		})
	}
}
