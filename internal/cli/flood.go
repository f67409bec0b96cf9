package cli

import (
	"fmt"

	"knotless.dev/run/internal/parts/intake"
)

// FloodFlags are serve's caps on what one event, and one pull author,
// may make the runner run and write (intake.Caps).
type FloodFlags struct {
	MaxWorkflowsPerEvent    int `help:"Most workflows one push or pull may run; one with more gets a single error check naming this flag and runs none (0: no cap)." default:"20" group:"limits"`
	MaxQueuedPerAuthor      int `help:"Most runs (one per workflow of an event) of one pull author queued or running at once; more wait, without a check, until runs end. An author with none in hand always gets one event in. Counted by run, not by pull (0: no cap). Pushes are claimed first." default:"20" group:"limits"`
	MaxCheckWritesPerAuthor int `help:"Check records one pull author's events may make the runner write per hour, refilled continuously; an event that would write more waits, without a check, until enough is refilled (0: no budget). With --limits-apply-to all, both author caps also count each repository owner's pushes." default:"200" group:"limits"`
}

// caps reads the flags as intake.Caps (0 on the command line is
// intake.NoCap).
func (f *FloodFlags) caps() (intake.Caps, error) {
	var c intake.Caps
	for _, x := range []struct {
		flag string
		v    int
		to   *int
	}{
		{"--max-workflows-per-event", f.MaxWorkflowsPerEvent, &c.WorkflowsPerEvent},
		{"--max-queued-per-author", f.MaxQueuedPerAuthor, &c.QueuedPerAuthor},
		{"--max-check-writes-per-author", f.MaxCheckWritesPerAuthor, &c.CheckWritesPerAuthor},
	} {
		switch {
		case x.v < 0:
			return c, usageError{fmt.Errorf("%s %d: want 0 (no cap) or more", x.flag, x.v)}
		case x.v == 0:
			*x.to = intake.NoCap
		default:
			*x.to = x.v
		}
	}
	return c, nil
}
