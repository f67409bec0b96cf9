// Package checks is the life of a dev.knotless.check record, and the
// daemon's checks part: the one status vocabulary (Status.Final is the
// one definition of final), the transitions a check may go through, the
// Recorder, the only code that writes the runner's check records, and
// the Keeper, which owns every transition the daemon makes (one method
// each), the mapping of a run's Result onto its final check, and the
// outbox of final checks the PDS has not taken. A write the PDS refuses
// as invalid is replaced by a minimal error check; a final check the
// PDS does not take now is owed (kept in state.json and written later),
// never a reason to run the work again.
package checks

import (
	"fmt"
	"slices"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
)

// Status is a check's status: queued and running, or a final one (a
// run's result).
type Status string

// The statuses of a check.
const (
	None      Status = "" // no record yet
	Queued    Status = forge.StatusQueued
	Running   Status = forge.StatusRunning
	Success          = Status(run.Success)
	Failure          = Status(run.Failure)
	Error            = Status(run.Error)
	Cancelled        = Status(run.Cancelled)
	// Skipped: the workflow did not run, as its path filters asked (it
	// counts as passing for the merge queue: Verdict).
	Skipped = Status(run.Skipped)
)

// Final reports whether s is a final status.
func (s Status) Final() bool { return s != None && s != Queued && s != Running }

// Transition names why a check's status changes.
type Transition string

// The transitions of a check.
const (
	// Queue: the work is queued (again: a check an earlier process left
	// queued or running is queued anew).
	Queue Transition = "queue"
	// Start: a worker started the run: from its queued check, or, when
	// a worker took the work at once, as the check's first record (no
	// queued check was written).
	Start Transition = "start"
	// Finish: the run ended (or the work cannot run): its result. A final
	// check written again unchanged (an owed one) is a Finish too.
	Finish Transition = "finish"
	// Release: a stopping runner gave the run back; queued again for its
	// successor.
	Release Transition = "release"
	// Supersede: a newer event cancelled the work (also work whose check
	// was not written yet).
	Supersede Transition = "supersede"
	// Invalid: the PDS refused the record; a minimal error check replaces
	// it, whatever it replaces.
	Invalid Transition = "invalid"
)

// Allowed says whether a check with status from may go to status to by
// t; the error names the refused move.
func Allowed(t Transition, from, to Status) error {
	var fromOK, toOK bool
	switch t {
	case Queue:
		fromOK, toOK = slices.Contains([]Status{None, Queued, Running}, from), to == Queued
	case Start:
		fromOK, toOK = from == None || from == Queued, to == Running
	case Finish:
		fromOK, toOK = !from.Final() || from == to, to.Final()
	case Release:
		fromOK, toOK = from == Queued || from == Running, to == Queued
	case Supersede:
		fromOK, toOK = !from.Final(), to == Cancelled
	case Invalid:
		fromOK, toOK = true, to == Error
	default:
		return fmt.Errorf("check transition %q unknown", t)
	}
	if !fromOK || !toOK {
		return &TransitionError{Transition: t, From: from, To: to}
	}
	return nil
}

// TransitionError is a status change the table refuses.
type TransitionError struct {
	Transition Transition
	From, To   Status
}

func (e *TransitionError) Error() string {
	from := e.From
	if from == None {
		from = "(none)"
	}
	return fmt.Sprintf("check may not %s from %s to %s", e.Transition, from, e.To)
}
