// Package workflow reads and validates knotless workflow files
// (.knotless/workflows/<name>.yaml). It is pure: no I/O beyond reading the
// files it is given.
package workflow

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// Dir is where a repository keeps its workflows.
const Dir = ".knotless/workflows"

// StepsDir is where a repository keeps shared steps for `uses`.
const StepsDir = ".knotless/steps"

// Trigger is an event a workflow runs on.
type Trigger string

// The events a workflow can run on.
const (
	Push  Trigger = "push"
	Pull  Trigger = "pull"
	Batch Trigger = "batch"
	// Dispatch runs when the owner writes a dispatch record for a ref,
	// with the Inputs it declares.
	Dispatch Trigger = "dispatch"
	// Schedule runs on the default branch's head at the ticks of the
	// Schedule's cron expressions.
	Schedule Trigger = "schedule"
)

// Workflow is one validated workflow file.
type Workflow struct {
	Name       string // the file stem
	File       string
	On         []Trigger
	Branches   []string
	Image      string
	Runners    []string
	Timeout    time.Duration
	Env        []EnvVar
	Secrets    []string
	Cache      []string
	Queue      string // "" or "first"
	Superseded string // "cancel" (the default) or "finish"
	// Concurrency, when set, is the workflow's concurrency group.
	Concurrency *Concurrency
	Resources   Resources
	// Class names the operator's resource class the run is placed in
	// and bounded by ("": the runner's default class). Whether the
	// runner has it is known at run time only.
	Class string
	Steps []Step
	// Services run beside the steps for the whole run, in file order
	// (services.go).
	Services []Service
	// Inputs are what a dispatch of the workflow may give (on: dispatch),
	// in file order.
	Inputs []Input
	// Schedule are the cron expressions of on: schedule, in file order.
	Schedule []Cron
	// Artifacts are the patterns of the outputs a run publishes (kept
	// for download with its log, see MatchArtifact), in file order.
	// None: a run publishes no file.
	Artifacts []string
	// If decides, for each event, whether the workflow runs: nil runs
	// it for every event it is on.
	If *Cond
	// PathFilters are the paths or paths-ignore of the push and pull
	// triggers that have them (PathsAdmit).
	PathFilters map[Trigger]PathFilter
	// Matrix, when set, makes the workflow a set of legs, each a run
	// with its own check (Legs).
	Matrix *Matrix
	// Needs are the workflows whose runs for the same event must
	// succeed before this one runs (needs.go), in file order.
	Needs []Need
	// Needed is set by Plan on a workflow another of its directory
	// needs: its artifacts are kept for the runs that need it.
	Needed bool
	// Retry, when set, tries a run again (Retry.Again); nil: once.
	Retry *Retry
	// Leg is set on a leg of a matrix (Legs); nil on the workflow a
	// file parses to.
	Leg *Leg
	// Warnings are fields that parse but are not acted on yet, in file
	// order: validate prints them and the daemon logs them.
	Warnings []Warning
}

// Warning is a field that parses but does nothing yet, because the
// feature it asks for has not landed, or that makes the workflow never
// run.
type Warning struct {
	Position
	Field, Msg string
}

func (w Warning) String() string {
	return fmt.Sprintf("%s:%d:%d: warning: %s", w.File, w.Line, w.Column, w.Msg)
}

// NeverRuns reports whether the workflow names no event, so nothing
// starts it (on: []).
func (w *Workflow) NeverRuns() bool { return len(w.On) == 0 }

// EnvVar is a plain variable, in file order.
type EnvVar struct {
	Name, Value string
}

// InputType is the type of a dispatch input.
type InputType string

// The types of dispatch inputs.
const (
	InputString  InputType = "string"
	InputBoolean InputType = "boolean" // the value is true or false
	InputChoice  InputType = "choice"  // the value is one of Options
)

// Input is one input a dispatch may give; it reaches the steps as the
// variable of its name.
type Input struct {
	Name        string
	Type        InputType
	Description string
	// Default is the value when a dispatch does not give one; nil for
	// none (the variable is then unset).
	Default *string
	// Required inputs must be given by the dispatch (they have no
	// default).
	Required bool
	// Options are the values a choice takes.
	Options []string
	Line    int
}

// Cron is one schedule entry: a five-field cron expression (minute,
// hour, day of month, month, day of week) or a descriptor such as
// @daily, in UTC.
type Cron struct {
	Spec string
	Line int
}

// Resources are the requests of a run.
type Resources struct {
	CPU, Memory string
}

// Step is one step of a workflow.
type Step struct {
	Name string
	Run  string // the POSIX sh script, or empty when Uses is set
	Uses string // a shared step from .knotless/steps/<Uses>
	// Image, when set, is the image of a container of the step's own
	// that sees the run's directories (pod executors); "" runs it in
	// the run's container.
	Image   string
	Timeout time.Duration
	Secrets []string
	// If decides whether the step runs; nil runs it while no earlier
	// step has failed and the run is not cancelled (success()).
	If *Cond
	// ContinueOnError: the step's failure (a non-zero exit or its
	// timeout) is recorded, and the run goes on as if it had succeeded.
	ContinueOnError bool
	// WorkingDirectory is where the step starts, relative to the
	// checkout ("" for the checkout itself); it holds no "..".
	WorkingDirectory string
	// Env are the step's own variables, in file order, after the
	// workflow's and the run's (StepEnv replaces the outputs of earlier
	// steps they name).
	Env []EnvVar
	// ReadsOutputs: the step's if or env reads an earlier step's
	// outputs, which are read from the session before it.
	ReadsOutputs bool
	Line         int
}

// Position is where an error is in a file.
type Position struct {
	File         string
	Line, Column int
}

// Error is one problem in a workflow file.
type Error struct {
	Position
	Msg string
}

func (e Error) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// Errors is every problem found in one file, in file order.
type Errors []Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// FileName is the name of the workflow whose file err (an Errors) is
// about: the file's base name without .yaml or .yml; "" when err names
// no file. A file that does not parse gets an error check by this name.
func FileName(err error) string {
	var es Errors
	if errors.As(err, &es) && len(es) > 0 {
		base := path.Base(es[0].File)
		return strings.TrimSuffix(strings.TrimSuffix(base, ".yaml"), ".yml")
	}
	return ""
}

// Matches reports whether the workflow runs for event on branch.
func (w *Workflow) Matches(event Trigger, branch string) bool {
	on := false
	for _, t := range w.On {
		on = on || t == event
	}
	if !on {
		return false
	}
	if len(w.Branches) == 0 {
		return true
	}
	for _, glob := range w.Branches {
		if ok, _ := path.Match(glob, branch); ok {
			return true
		}
	}
	return false
}

// AllowsRunner reports whether the workflow may run on the runner did.
// A workflow that names no runners runs on any runner the repository names.
func (w *Workflow) AllowsRunner(did string) bool {
	if len(w.Runners) == 0 {
		return true
	}
	for _, r := range w.Runners {
		if r == did {
			return true
		}
	}
	return false
}

// StepNames lists the step names in order.
func (w *Workflow) StepNames() []string {
	names := make([]string, len(w.Steps))
	for i, s := range w.Steps {
		names[i] = s.Name
	}
	return names
}
