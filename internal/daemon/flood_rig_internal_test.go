package daemon

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/work"
)

// The flood caps on the rig: serve itself, with the check writes
// counted as the real daemon counts them (the recorder's hook).

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
func (l *writeLog) of(ev work.Event) []string {
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

// countWrites is a harness whose daemon counts check writes against the
// authors' budget of n per hour and logs them in the returned log.
func countWrites(t *testing.T, n int, mod func(*Config)) (*harness, *writeLog) {
	l := &writeLog{}
	h := newHarness(t, func(c *Config) {
		c.Intake.Caps.CheckWritesPerAuthor = n
		c.OnCheck = l.add
		if mod != nil {
			mod(c)
		}
	})
	return h, l
}

// A push or pull whose workflows are more than WorkflowsPerEvent gets
// one error check naming the limit, and nothing runs; an event within
// it runs as ever.
func TestServeWorkflowsPerEvent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h, log := countWrites(t, intake.NoCap, func(c *Config) { c.Intake.Caps.WorkflowsPerEvent = 2 })
		h.git.SetWorkflows(rig.CI("a", "make"), rig.CI("b", "make"), rig.CI("c", "make"))
		big, owners := rig.Pull("did:plc:author", "3p1", "h1"), rig.Push("3k1", "c1")
		h.lister.Set(big, owners)
		h.serveUntilIdle(t)
		want := []string{"(refused) error"}
		for _, ev := range []work.Event{big, owners} {
			if diff := cmp.Diff(want, log.of(ev)); diff != "" {
				t.Errorf("%s: check writes (-want +got):\n%s", ev.URI, diff)
			}
			if c := h.final(ev, intake.RefusedCheck); c.Error != "3 workflows match this event, more than --max-workflows-per-event allows (2): none of them runs" {
				t.Errorf("%s: error %q", ev.URI, c.Error)
			}
		}
		if len(h.git.Exported()) != 0 {
			t.Errorf("exported %v: want nothing run", h.git.Exported())
		}
	})
}

// An author whose budget of check writes is spent has its next commit
// wait, without a check, while another author's pull runs; when the
// budget has refilled (an hour), the newest commit runs.
func TestServeCheckWriteBudget(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h, log := countWrites(t, 12, nil) // one commit of four workflows
		h.git.SetWorkflows(rig.CI("a", "make"), rig.CI("b", "make"), rig.CI("c", "make"), rig.CI("d", "make"))
		first, other := rig.Pull("did:plc:author", "3p1", "h1"), rig.Pull("did:plc:other", "3p2", "o1")
		h.lister.Set(first)
		stop := h.serve(t)
		synctest.Wait()
		// The worker was free for a: running, success; b, c and d
		// waited: queued, running, success each.
		if got := len(log.of(first)); got != 11 {
			t.Fatalf("the first commit: %d writes %v, want 11", got, log.of(first))
		}

		moved := rig.Pull("did:plc:author", "3p1", "h2")
		h.lister.Set(moved, other)
		h.d.intake.Wake()
		synctest.Wait()
		if got := log.of(moved); len(got) != 0 {
			t.Errorf("the moved pull over its author's budget has checks %v, want none while it waits", got)
		}
		if got := len(log.of(other)); got != 11 {
			t.Errorf("another author's pull: %d writes, want 11: budgets are per author", got)
		}

		time.Sleep(70 * time.Minute) // the polls go on; the budget refills
		synctest.Wait()
		stop()
		for _, wf := range []string{"a", "b", "c", "d"} {
			if c := h.final(moved, wf); c.Status != "success" {
				t.Errorf("the moved pull's %s after the refill: %q, want success", wf, c.Status)
			}
		}
	})
}
