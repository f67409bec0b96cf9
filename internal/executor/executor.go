// Package executor is the contract between the run engine and the places a
// run can execute: a Kubernetes Job, a Docker container, or a local shell.
//
// A session is one run's sandbox. It outlives the process that started it
// where the executor allows (its Ref is serializable), and a step in it is
// started, followed from a byte offset and awaited, so a dropped stream or
// a restarted runner can pick a step up again.
package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"knotless.dev/run/internal/rules/class"
)

// Executor starts sessions and sweeps the leftovers of earlier runs.
type Executor interface {
	// Name is the executor's name as the --executor flag spells it.
	Name() string
	// Start creates a session for one run and waits until it can run steps.
	Start(ctx context.Context, spec Spec) (Session, error)
	// Sweep removes every session of this runner whose run is not in keep,
	// and returns the refs of what it removed.
	Sweep(ctx context.Context, keep []string) ([]Ref, error)
}

// The optional capabilities. An executor (or its sessions) may do more
// than the contract's core above; each such capability is declared here,
// found once when the daemon starts (CapabilitiesOf) and handed to the
// daemon's parts as facts, never asked of the executor anywhere else.
// Each has a subtest in the conformance table that runs when an
// executor has it.

// Resumer is an Executor that can take a session over from another
// process by its Ref.
type Resumer interface {
	Resume(ctx context.Context, ref Ref) (Session, error)
}

// Warmer is an Executor that can start sessions ahead of runs (serve
// --warm-pods): a run whose session would be the same takes one, and
// each serves one run.
type Warmer interface {
	// KeepWarm keeps n sessions ready until ctx ends, then removes the
	// ones no run took.
	KeepWarm(ctx context.Context, n int)
}

// Releaser is a Session that can let go of its steps' streams: they end
// at once (the steps are not told, no output is acknowledged), the steps
// and the session go on, and another process can Resume the session and
// follow them. The session stays usable; Stop still removes it.
type Releaser interface {
	Release()
}

// HealthChecker is an Executor that can tell whether it can take runs
// now (Kubernetes: the credentials load and have not expired, the API
// server answers); nil means it can.
type HealthChecker interface {
	Health(ctx context.Context) error
}

// GoneChecker is an Executor that can tell whether a session another
// process handed over can no longer go on (its Job deleted or ended, its
// pod lost). An error means it could not tell.
type GoneChecker interface {
	Gone(ctx context.Context, ref Ref) (bool, error)
}

// Stopper is an Executor that can remove a session by its Ref alone,
// one another process started included, and returns once it is gone:
// nothing of it runs any more. A runner whose executor changed stops
// with it what its predecessor handed over (it cannot adopt it).
type Stopper interface {
	StopSession(ctx context.Context, ref Ref) error
}

// ImageChecker is an Executor that can tell, cheaply and without
// running anything, whether a run of an image could start: nil when it
// could, else an error naming the image and why not. The daemon asks
// it of the images the workflows it watches name, and warns.
type ImageChecker interface {
	CheckImage(ctx context.Context, image string) error
}

// Capabilities are the optional capabilities an executor has: nil for
// each it lacks.
type Capabilities struct {
	Resumer Resumer
	Warmer  Warmer
	Health  HealthChecker
	Gone    GoneChecker
	Stopper Stopper
	Images  ImageChecker
}

// CapabilitiesOf asks ex, once, what it can do beyond the core.
func CapabilitiesOf(ex Executor) Capabilities {
	var c Capabilities
	c.Resumer, _ = ex.(Resumer)
	c.Warmer, _ = ex.(Warmer)
	c.Health, _ = ex.(HealthChecker)
	c.Gone, _ = ex.(GoneChecker)
	c.Stopper, _ = ex.(Stopper)
	c.Images, _ = ex.(ImageChecker)
	return c
}

// Detaches reports whether a run on the executor can be detached: left
// going at a stop and adopted by the successor. Only an executor that
// resumes sessions detaches; on any other a run finishes (or is
// cancelled) in its own process. This is the one place it is decided.
func (c Capabilities) Detaches() bool { return c.Resumer != nil }

// StepLedger is a Session that keeps, inside itself, a record of its
// steps that outlives the process following them (Kubernetes: a file in
// the pod): which steps started and how each ended. A process that takes
// a run over after the one following it died asks it, so that it never
// starts a step twice.
type StepLedger interface {
	// Ledger returns the record by step id; a step it does not name
	// never started.
	Ledger(ctx context.Context) (map[string]StepRecord, error)
}

// StepRecord is what a session's ledger says of one step.
type StepRecord struct {
	// Exit is the step's exit code once it ended; nil while it runs.
	Exit *int
}

// Release lets go of the streams of sess when its executor releases
// sessions (Releaser), and reports whether it did.
func Release(sess Session) bool {
	r, ok := sess.(Releaser)
	if ok {
		r.Release()
	}
	return ok
}

// Session is one run's sandbox.
type Session interface {
	// Ref identifies the session for state.json and Resume.
	Ref() Ref
	// Dirs tells where the run's directories are, as steps see them.
	Dirs() Dirs
	// Put unpacks the tar stream r at dir, a directory inside the session.
	Put(ctx context.Context, dir string, r io.Reader) error
	// Get writes the tree at dir inside the session to w as a tar stream.
	Get(ctx context.Context, dir string, w io.Writer) error
	// StartStep starts a step detached: sh reads payload on its stdin.
	// id is unique within the session.
	StartStep(ctx context.Context, id string, payload []byte) error
	// FollowStep writes the step's combined output from byte offset on to
	// out until the step has ended and its output is drained, and returns
	// its exit. When ctx ends first it returns the context's error and the
	// step goes on. An exit that cannot be learned is ErrExitUnknown, never
	// a guess.
	FollowStep(ctx context.Context, id string, offset int64, out io.Writer) (Exit, error)
	// KillStep kills every process of the step.
	KillStep(ctx context.Context, id string) error
	// Stop removes the session and everything it made. It is safe to call
	// more than once.
	Stop(ctx context.Context) error
}

// Spec is what a session is started from.
type Spec struct {
	RunID     string // unique per run; label-safe
	Runner    string // the runner's DID
	Image     string
	Resources Resources
	// Class is the operator's resource class the run is in: its bounds
	// are the session's limits and its placement the session's (the
	// engine has clamped Resources to it already).
	Class class.Class
	// Timeout bounds the whole run; an executor may enforce it as a
	// last resort (a Job's active deadline).
	Timeout time.Duration
	// Keep leaves the session in place after Stop, for debugging.
	Keep bool
	// Annotations are recorded on the session's objects (check key, DID).
	Annotations map[string]string
	// Trusted is the run's trust as the engine has it (run.Request.
	// Trusted: a push by the owner). An executor never decides it; it
	// may only give an untrusted run less (no pull credentials, a
	// narrower network).
	Trusted bool
	// Caches are absolute directories the run keeps caches in: the
	// executor makes each an empty directory the steps can write, on
	// the session's disk (cache paths relative to the work directory
	// need nothing).
	Caches []string
	// Services run beside the steps (services.go); an executor whose
	// sessions are no ServiceRunner refuses a Spec that has any.
	Services []Service
	// StepImages are the images of the steps that name their own, by
	// step id (as StartStep names it): such a step runs in a container
	// of its image that sees the run's directories (Dirs), beside the
	// run's. An executor that cannot refuses a Spec that has any.
	StepImages map[string]string
}

// Resources are a run's requests.
type Resources struct {
	CPU, Memory string
}

// Dirs are the run's well-known directories inside the session.
type Dirs struct {
	Work, Steps, Outputs string
	// Root, when set, is the directory Work and Steps are children of,
	// where Put takes one tar stream whose entries are named under their
	// base names (work/..., steps/...): the checkout and the step
	// scripts go in in one transfer. Empty: each is put on its own.
	Root string
}

// Ref is a session's serializable identity.
type Ref struct {
	Executor  string `json:"executor"`
	RunID     string `json:"run"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

func (r Ref) String() string {
	if r.Namespace != "" {
		return fmt.Sprintf("%s:%s/%s", r.Executor, r.Namespace, r.Name)
	}
	return fmt.Sprintf("%s:%s", r.Executor, r.Name)
}

// Exit is how a step ended.
type Exit struct {
	Code int
}

// ErrExitUnknown means a step's end could not be learned: its stream
// ended and its exit status could not be read back.
var ErrExitUnknown = errors.New("step exit status unknown")

// ErrTransferCorrupt means a tar transfer did not arrive whole or
// unchanged (the digests of its two ends differ, or the stream's end did
// not arrive); the engine sends it again once.
var ErrTransferCorrupt = errors.New("transfer corrupted")

// ErrRunExists means Start found the run's session there already: the
// objects of a run are named from its id (run.IDFor), and a second
// create of them fails. Some process drives that session (or its
// deletion has not ended within Start's wait); this one must not run
// the work again, nor write its check: it is fenced.
var ErrRunExists = errors.New("the run's session exists already")

// ErrSessionGone means the run's session is not there (or is being
// deleted): with replicas, a claim of the run finds nothing to claim.
var ErrSessionGone = errors.New("the run's session is gone")

// ErrNotImplemented is returned by executors that are not built yet.
var ErrNotImplemented = errors.New("executor not implemented")

// Environment variable names that tell a step where the run's
// directories are.
const (
	EnvWork     = "KNOTLESS_RUN_WORK"
	EnvSteps    = "KNOTLESS_RUN_STEPS"
	EnvOutputs  = "KNOTLESS_RUN_OUTPUTS"
	EnvRunID    = "KNOTLESS_RUN_ID"
	EnvWorkflow = "KNOTLESS_RUN_WORKFLOW"
	EnvStep     = "KNOTLESS_RUN_STEP"
	// EnvStepOutput names the file a step writes its outputs to
	// (key=value lines), in the session's StepOutputsDir.
	EnvStepOutput = "KNOTLESS_RUN_STEP_OUTPUT"
)

// StepOutputsDir is the directory of the steps' outputs files, under
// the steps directory: the engine makes it with the scripts, and reads
// it back (Get) before a step that reads an earlier step's outputs.
const StepOutputsDir = "out"

// PodDirs are the directories inside a pod or container.
func PodDirs() Dirs {
	return Dirs{Work: "/work", Steps: "/steps", Outputs: "/outputs"}
}
