package run

import (
	"errors"
	"fmt"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/mask"
)

// Status is how a run or a step ended.
type Status string

// The statuses. A run is never left without one of the final four.
const (
	Success   Status = "success"
	Failure   Status = "failure"   // a step failed or timed out: the code's fault
	Error     Status = "error"     // the runner or the infrastructure failed
	Cancelled Status = "cancelled" // the run was stopped from outside
	Skipped   Status = "skipped"   // a step not run: its condition (if:) did not hold, or the run ended before it
	// Detached is not final: the run was handed over (Request.Detach)
	// and goes on in its session for a successor to Adopt. A Detached
	// result without a Handover was detached before its session started:
	// nothing goes on, and the successor runs the work from the start.
	Detached Status = "detached"
)

// ErrStopped is the cause (context.WithCancelCause) a stopping runner
// cancels the runs it releases to its successor with: after such a
// cancel no step runs, not even one whose if holds (always(),
// cancelled()), since the run starts again elsewhere.
var ErrStopped = errors.New("runner stopping: the run goes to the next runner process")

// Result is the outcome of a run; it maps one-to-one onto a
// dev.knotless.check record.
type Result struct {
	RunID      string `json:"run"`
	Workflow   string `json:"workflow"`
	Executor   string `json:"executor"`
	Status     Status `json:"status"`
	FailedStep string `json:"failedStep,omitempty"`
	Error      string `json:"error,omitempty"`
	// StepError is the failure of the step that ended the run (status
	// failure): the step, its exit code or timeout and the tail of its
	// output, for whoever prints the run's end; Error is its text. Nil
	// when no step failed.
	StepError *StepError   `json:"-"`
	Steps     []StepResult `json:"steps"`
	Outputs   []string     `json:"outputs,omitempty"`
	// Artifacts are the Outputs an artifacts entry of the workflow
	// names: the only files of the run that may be published.
	Artifacts  []string  `json:"artifacts,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt"`
	// Fenced: the run's session existed already (executor.ErrRunExists),
	// so another process drives it. Status is Detached, Handover nil;
	// the caller writes nothing of the run.
	Fenced bool `json:"fenced,omitempty"`
	// Lost: what ended the run (status error) was the infrastructure's
	// (executor.ErrInfrastructure): its pod disrupted or deleted, its
	// node gone. A workflow's retry tries such a run again.
	Lost bool `json:"lost,omitempty"`
	// Tries is how many runs of the work this result ends, the retries
	// of a lost run (workflow.Retry) counted; 0 or 1 for one.
	Tries int `json:"tries,omitempty"`
	// Handover is where a Detached run stopped.
	Handover *Handover `json:"handover,omitempty"`
	// Log is the masked run log, capped; it is written on its own.
	Log []byte `json:"-"`
	// LogSize is how many bytes were written to the log, kept or cut:
	// the length of the run's output stream (Request.Live).
	LogSize int64 `json:"logSize,omitempty"`
	// Mask masks what the log masks (the granted secrets' values and
	// their forms): a published file is copied through it. Nil when the
	// log was never opened.
	Mask *mask.Set `json:"-"`
}

// Handover is what a successor process needs to Adopt a detached run:
// the session, the step that was going and how much of its output the
// log already holds. The log itself travels beside it (Result.Log).
type Handover struct {
	Session executor.Ref `json:"session"`
	// Step is the index of the step to go on with; Started says whether
	// it was started (follow it from Offset) or not (start it).
	Step          int       `json:"step"`
	Started       bool      `json:"started,omitempty"`
	Offset        int64     `json:"offset,omitempty"`
	StepStartedAt time.Time `json:"stepStartedAt,omitzero"`
	// StartedAt is the run's start; SessionStartedAt the session's, from
	// which the workflow's timeout counts.
	StartedAt        time.Time `json:"startedAt"`
	SessionStartedAt time.Time `json:"sessionStartedAt"`
	// Steps are the step results so far.
	Steps []StepResult `json:"steps"`
	// CachesClean says every cache layer the run restored was clean
	// (cache.Clean), so what it saves is clean unless it was granted a
	// secret. Absent (a handover from an older process), the adopter's
	// layers are tainted.
	CachesClean bool `json:"cachesClean,omitempty"`
	// Status, FailedStep and Error are what ended the run before the
	// handover when a step failed and later steps still ran (if:
	// failure() or always()); empty when none has. The successor keeps
	// them, so the run's status stays the first failure's.
	Status     Status `json:"status,omitempty"`
	FailedStep string `json:"failedStep,omitempty"`
	Error      string `json:"error,omitempty"`
	// LogSize is how many bytes the log had when the run was handed
	// over, kept or cut: the offset in the run's output stream at which
	// the successor's first byte goes. Zero (a handover written before
	// it was recorded) means len of the log handed over.
	LogSize int64 `json:"logSize,omitempty"`
	// Replay marks a checkpoint (Request.Checkpoint) rather than a
	// handover: it was taken before step Step's header was logged, so
	// whether that step started is the session's ledger's to say
	// (executor.StepLedger). If it did, the adopter logs the header
	// again and follows the step's output from its first byte: the log
	// goes on byte for byte as the process that died wrote it. Step
	// equal to the number of steps: every step had ended or been skipped
	// (Status says how the run stands).
	Replay bool `json:"replay,omitempty"`
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
	// Tail is the last lines of the step's masked output (at most 10
	// lines, 2 KiB), as this process followed it; not in Error's text.
	Tail string
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
