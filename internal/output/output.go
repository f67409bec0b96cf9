// Package output is a run's output stream: the masked run log as an
// append-only byte stream with offsets, the same bytes at the same
// offsets as the log blob of the final check (internal/engine/caplog keeps the
// head and the tail of it; a stream keeps them the same way). A Stream
// is written by the engine's Request.Live tap and read from any offset;
// readers are told of new bytes without ever holding the writer up, and
// one that falls behind catches up by offset. A Hub keeps a runner's
// streams in memory; a Store keeps an output service's on disk, with
// their files, bounded and with retention. The types of the
// dev.knotless.*RunOutput lexicons are here too (wire.go).
package output

import (
	"errors"
	"time"

	"knotless.dev/run/internal/engine/caplog"
)

// The kinds of Mark.
const (
	// MarkTime says when the byte at its offset was written; a stream
	// makes one at most each second (of the wall clock) of output.
	MarkTime = "time"
	// MarkStepStart is where a step's header line begins.
	MarkStepStart = "stepStart"
	// MarkStepEnd is where a step's footer line begins.
	MarkStepEnd = "stepEnd"
)

// Mark is a point of the stream that is not a byte of it: a time, or a
// step boundary from the engine (never from a step's output).
type Mark struct {
	Offset int64
	Time   time.Time
	Kind   string
	// Step counts from 1 (step marks).
	Step int
	// Name is the step's (MarkStepStart), Status how it ended
	// (MarkStepEnd).
	Name, Status string
}

// Limits bound one stream.
type Limits struct {
	// Head and Tail are the bytes kept: the first Head bytes and the
	// last Tail bytes of the stream. A reader of a byte between them is
	// told it was cut, as the final log's marker says.
	Head, Tail int64
	// Marks is how many marks are kept; past it, time marks are dropped
	// (step marks are kept, up to Marks+StepMarks).
	Marks int
	// Subscribers is how many readers may watch the stream at once.
	Subscribers int
}

// StepMarks is the room kept for step marks past Limits.Marks: two for
// each of the at most 256 steps of a workflow, and the marks of an
// adopted step again.
const StepMarks = 1024

// RunnerLimits are the bounds of a runner's in-memory stream: it keeps
// exactly the bytes the final log blob keeps (caplog.DefaultMax), so
// its bytes are the blob's at the same offsets.
func RunnerLimits() Limits {
	head, tail := caplog.Split(caplog.DefaultMax)
	return Limits{Head: int64(head), Tail: int64(tail), Marks: 8192, Subscribers: 1000}
}

// Errors.
var (
	// ErrTooManySubscribers refuses a watcher past a bound.
	ErrTooManySubscribers = errors.New("too many subscribers")
	// ErrTooManyRuns refuses a stream past a bound of live runs.
	ErrTooManyRuns = errors.New("too many live runs")
	// ErrNotFound is a run no stream (or a file no file) is kept of.
	ErrNotFound = errors.New("run output not found")
	// ErrRunReplaced refuses a put for a run of a check whose stream a
	// later run of the check has replaced.
	ErrRunReplaced = errors.New("the check's output is another run's now")
	// ErrTooManyFiles and ErrFileTooLarge refuse a run's file past the
	// bounds on its files.
	ErrTooManyFiles = errors.New("too many files")
	ErrFileTooLarge = errors.New("files too large")
	// ErrBadPath refuses a file path that is not a clean relative path.
	ErrBadPath = errors.New("bad file path")
)
