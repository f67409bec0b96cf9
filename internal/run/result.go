package run

import (
	"fmt"
	"time"
)

// Status is how a run or a step ended.
type Status string

// The statuses. A run is never left without one of the final four.
const (
	Success   Status = "success"
	Failure   Status = "failure"   // a step failed or timed out: the code's fault
	Error     Status = "error"     // the runner or the infrastructure failed
	Cancelled Status = "cancelled" // the run was stopped from outside
	Skipped   Status = "skipped"   // a step not run because an earlier one ended the run
)

// Result is the outcome of a run; it maps one-to-one onto a
// dev.knotless.check record.
type Result struct {
	RunID      string       `json:"run"`
	Workflow   string       `json:"workflow"`
	Executor   string       `json:"executor"`
	Status     Status       `json:"status"`
	FailedStep string       `json:"failedStep,omitempty"`
	Error      string       `json:"error,omitempty"`
	Steps      []StepResult `json:"steps"`
	Outputs    []string     `json:"outputs,omitempty"`
	StartedAt  time.Time    `json:"startedAt"`
	FinishedAt time.Time    `json:"finishedAt"`
	// Log is the masked run log, capped; it is written on its own.
	Log []byte `json:"-"`
}

// StepResult is one step's outcome.
type StepResult struct {
	Name     string        `json:"name"`
	Status   Status        `json:"status"`
	ExitCode *int          `json:"exitCode,omitempty"`
	Duration time.Duration `json:"durationNs"`
	// TimedOut is set when the step was killed at its timeout.
	TimedOut bool `json:"timedOut,omitempty"`
}

// StepError is the failure of one step: a run result, not a fault of the
// runner.
type StepError struct {
	Step     string
	ExitCode *int
	TimedOut bool
	Timeout  time.Duration
	Tail     string // the last lines of the step's masked output
}

func (e *StepError) Error() string {
	switch {
	case e.TimedOut:
		return fmt.Sprintf("step %q timed out after %s", e.Step, e.Timeout)
	case e.ExitCode != nil:
		return fmt.Sprintf("step %q exited with code %d", e.Step, *e.ExitCode)
	default:
		return fmt.Sprintf("step %q failed", e.Step)
	}
}
