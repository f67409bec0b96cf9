package daemon

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/checks"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
)

// The flood caps on the rig (flood.go, floodcaps.go): serve itself,
// with the check writes counted as the real daemon counts them.

// writeLog collects the checks written, with their subjects.
type writeLog struct {
	mu     sync.Mutex
	checks []forge.Check
}

func (l *writeLog) add(_ string, c forge.Check) {
	l.mu.Lock()
	l.checks = append(l.checks, c)
	l.mu.Unlock()
}

// of lists workflow and status of each check written for ev.
func (l *writeLog) of(ev ingest.Event) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, c := range l.checks {
		if c.Subject.Event == ev.URI.String() && c.Subject.Commit == ev.Commit {
			out = append(out, c.Workflow+" "+c.Status)
		}
	}
	return out
}

// countWrites makes r's daemon count check writes against the authors'
// budget of n per hour, as Run's does, and log them in the returned
// log.
func countWrites(r *rig, n int) *writeLog {
	l := &writeLog{}
	r.d.cfg.Caps.CheckWritesPerAuthor = n
	r.d.budget = newWriteBudget(n, time.Hour)
	r.d.cfg.OnCheck = l.add
	r.d.rec = checks.NewRecorder(r.pds, r.d.noteCheck)
	return l
}

// A push or pull whose workflows are more than WorkflowsPerEvent gets
// one error check naming the limit, and nothing runs; an event within
// it runs as ever.
func TestServeWorkflowsPerEvent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		log := countWrites(r, NoCap)
		r.d.cfg.Caps.WorkflowsPerEvent = 2
		r.git.setWorkflows(ciWorkflow("a", "make"), ciWorkflow("b", "make"), ciWorkflow("c", "make"))
		big, owners := pull("did:plc:author", "3p1", "h1"), push("3k1", "c1")
		r.in.set(big, owners)
		serveUntilIdle(t, r.d)
		want := []string{"(refused) error"}
		for _, ev := range []ingest.Event{big, owners} {
			if diff := cmp.Diff(want, log.of(ev)); diff != "" {
				t.Errorf("%s: check writes (-want +got):\n%s", ev.URI, diff)
			}
			if c := r.final(ev, refusedCheck); c.Error != "3 workflows match this event, more than --max-workflows-per-event allows (2): none of them runs" {
				t.Errorf("%s: error %q", ev.URI, c.Error)
			}
		}
		if len(r.git.exported) != 0 {
			t.Errorf("exported %v: want nothing run", r.git.exported)
		}
	})
}

// An author whose budget of check writes is spent has its next commit
// wait, without a check, while another author's pull runs; when the
// budget has refilled (an hour), the newest commit runs.
func TestServeCheckWriteBudget(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		log := countWrites(r, 12) // one commit of four workflows
		r.git.setWorkflows(ciWorkflow("a", "make"), ciWorkflow("b", "make"), ciWorkflow("c", "make"), ciWorkflow("d", "make"))
		first, other := pull("did:plc:author", "3p1", "h1"), pull("did:plc:other", "3p2", "o1")
		r.in.set(first)
		stop := serveRig(t, r.d)
		synctest.Wait()
		if got := len(log.of(first)); got != 12 {
			t.Fatalf("the first commit: %d writes %v, want 12 (queued, running, success of each)", got, log.of(first))
		}

		moved := pull("did:plc:author", "3p1", "h2")
		r.in.set(moved, other)
		r.d.Wake()
		synctest.Wait()
		if got := log.of(moved); len(got) != 0 {
			t.Errorf("the moved pull over its author's budget has checks %v, want none while it waits", got)
		}
		if got := len(log.of(other)); got != 12 {
			t.Errorf("another author's pull: %d writes, want 12: budgets are per author", got)
		}

		time.Sleep(70 * time.Minute) // the polls go on; the budget refills
		synctest.Wait()
		stop()
		for _, wf := range []string{"a", "b", "c", "d"} {
			if c := r.final(moved, wf); c.Status != "success" {
				t.Errorf("the moved pull's %s after the refill: %q, want success", wf, c.Status)
			}
		}
	})
}
