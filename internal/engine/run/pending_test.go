package run

import (
	"context"
	"strings"
	"testing"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/workflow"
)

// pendingExecutor's sessions never become ready (a pod that stays
// Pending): Start waits until its context ends, then removes what it
// made, as the Kubernetes executor does after a failed start.
type pendingExecutor struct {
	waiting chan struct{} // closed when Start waits
	removed chan struct{} // closed when Start gave up and cleaned up
}

func (e *pendingExecutor) Name() string { return "pending" }
func (e *pendingExecutor) Start(ctx context.Context, _ executor.Spec) (executor.Session, error) {
	close(e.waiting)
	<-ctx.Done()
	close(e.removed)
	return nil, ctx.Err()
}
func (e *pendingExecutor) Sweep(context.Context, []string) ([]executor.Ref, error) { return nil, nil }
func (e *pendingExecutor) Resume(context.Context, executor.Ref) (executor.Session, error) {
	return nil, executor.ErrNotImplemented
}

// TestDetachBeforeSessionStarted: a run detached while its session is
// still starting does not wait for it: Start is cancelled (and cleans
// up), and the result is Detached without a Handover, so the caller
// releases the work instead of handing over a session that is not there.
func TestDetachBeforeSessionStarted(t *testing.T) {
	t.Parallel()
	ex := &pendingExecutor{waiting: make(chan struct{}), removed: make(chan struct{})}
	eng := New(Config{Executor: ex})
	detach := make(chan struct{})
	req := Request{
		RunID:    "r",
		Workflow: &workflow.Workflow{Name: "w", Steps: []workflow.Step{{Name: "s", Run: "true"}}},
		Checkout: t.TempDir(),
		Detach:   detach,
	}
	go func() { <-ex.waiting; close(detach) }()
	// The run's own context never ends: only the detach can end Start.
	res := eng.Run(context.Background(), req)
	if res.Status != Detached || res.Handover != nil {
		t.Fatalf("status %s, handover %+v; want detached without a handover", res.Status, res.Handover)
	}
	select {
	case <-ex.removed:
	default:
		t.Error("Start returned without cleaning up")
	}
	if !strings.Contains(string(res.Log), "before the session started") {
		t.Errorf("the log does not say why the run stopped:\n%s", res.Log)
	}
	if res.Steps[0].Status != Skipped {
		t.Errorf("step %s, want skipped", res.Steps[0].Status)
	}
}
