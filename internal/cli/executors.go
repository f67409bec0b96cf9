package cli

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/alecthomas/kong"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/tarstream"
	"knotless.dev/run/internal/lib/version"
	"knotless.dev/run/internal/rules/class"
)

// ExecutorFlags choose the executor and configure each one. run and serve
// both embed them, so every executor flag works with both commands.
//
// Each embedded struct is one executor's flags, and its executorDef
// names the executor and builds it; executors lists them. --executor's
// choices, the constructor that flag picks and --dry-run's directories
// all come from that list. To add an executor, add its file (flags
// struct and executorDef), embed its flags here and list it in
// executors: two lines.
type ExecutorFlags struct {
	Executor string   `help:"Where runs execute: ${executor_help}. Never chosen implicitly, never a fallback." enum:"${executor_enum}" default:"${executor_default}"`
	Image    string   `help:"Image for workflows that name none (pod executors)." default:"busybox:stable"`
	Class    []string `help:"A resource class workflows name with class: (repeatable): its bounds cpu, memory, ephemeral-storage (Kubernetes) and pids (Docker), its placement node-selector=LABEL=VALUE and toleration=KEY[=VALUE]:EFFECT (Kubernetes, each repeatable), untrusted when pulls may name it. The class default is a run's that names none, open to pulls; a class with no ephemeral-storage has the default's (10Gi unless set)." placeholder:"NAME:KEY=VALUE,..." sep:"none"`

	KubeFlags   `embed:""`
	DockerFlags `embed:""`
	ShellFlags  `embed:""`

	// driver is serve's replica name with --replicas: the Kubernetes
	// executor marks the Jobs it creates with it.
	driver, driverInvocation string `kong:"-"`
}

// defaultExecutor is the executor when --executor is not given.
const defaultExecutor = "kubernetes"

// executorDef is one executor as the command line knows it.
type executorDef struct {
	// Name is the executor's name as --executor spells it; Aliases are
	// other spellings of it.
	Name    string
	Aliases []string
	// What says, in a few words, where its runs execute (for --help).
	What string
	// Dirs are a run's directories as --dry-run shows them.
	Dirs executor.Dirs
	// New builds the executor from its flags.
	New func(env *Env, o executorOptions) (executor.Executor, error)
	// DryRun, if set, prints what the executor would create for spec
	// (values in secrets masked) before --dry-run prints the payloads.
	DryRun func(env *Env, o executorOptions, spec executor.Spec, secrets map[string]string) error
	// Stopper, if set, builds from the flags what stops a session of
	// this executor by its Ref (executor.Stopper), for a runner that
	// moved to another executor: only what reaching it needs.
	Stopper func(env *Env, o executorOptions) (executor.Stopper, error)
}

// executorOptions are what every executor is built with, besides its
// own flags.
type executorOptions struct {
	Runner string // the runner's DID
	Image  string // the image for workflows that name none
	// Concurrency is how many runs may go at once (serve's
	// --concurrency; one for run).
	Concurrency int
	// Limits bound every transfer the executor makes (BoundFlags.transfer).
	Limits tarstream.Limits
	Logger *slog.Logger
	// Observer is told what the executor does (serve's metrics); nil:
	// nothing.
	Observer executor.Observer
	// Classes are the runner's resource classes (ExecutorFlags.classes).
	Classes class.Set
	// Driver is serve's replica name with --replicas ("": one process),
	// DriverInvocation this process.
	Driver, DriverInvocation string
}

// executors lists the registered executors, in the order ExecutorFlags
// embeds them; each one's New and DryRun read f's flags.
// TestExecutorsAreRegistered fails when an embedded struct is missing.
func (f *ExecutorFlags) executors() []executorDef {
	return []executorDef{
		f.KubeFlags.executorDef(),
		f.DockerFlags.executorDef(),
		f.ShellFlags.executorDef(),
	}
}

// lookup finds the executor --executor names, by name or alias.
func (f *ExecutorFlags) lookup() (executorDef, error) {
	for _, d := range f.executors() {
		if d.Name == f.Executor || slices.Contains(d.Aliases, f.Executor) {
			return d, nil
		}
	}
	return executorDef{}, usageError{fmt.Errorf("--executor %s: unknown executor", f.Executor)}
}

// newExecutor builds the executor --executor names for concurrency runs
// at once, each transfer within lim, telling obs (nil: nothing) what it
// does. No other code path chooses one, and none falls back to another.
func (f *ExecutorFlags) newExecutor(env *Env, runner string, concurrency int, lim tarstream.Limits, log *slog.Logger, obs executor.Observer) (executor.Executor, error) {
	d, err := f.lookup()
	if err != nil {
		return nil, err
	}
	classes, err := f.classes()
	if err != nil {
		return nil, err
	}
	return d.New(env, executorOptions{Runner: runner, Image: f.Image, Concurrency: concurrency, Limits: lim,
		Logger: log.With("component", "executor", "executor", d.Name), Observer: obs, Classes: classes, Driver: f.driver, DriverInvocation: f.driverInvocation})
}

// stopForeign stops the sessions an earlier process handed over on
// another executor than --executor (the operator moved the runner), by
// their Ref, with that executor built from its flags as they are now
// (the flags of the executors not chosen are kept for this): built once,
// when the first such session is met. It fails when that executor has
// no Stopper, or cannot be reached with the flags (no kubeconfig).
func (f *ExecutorFlags) stopForeign(env *Env, runner string, log *slog.Logger) func(ctx context.Context, ref executor.Ref) error {
	built := map[string]executor.Stopper{}
	return func(ctx context.Context, ref executor.Ref) error {
		st, ok := built[ref.Executor]
		if !ok {
			var d executorDef
			for _, e := range f.executors() {
				if e.Name == ref.Executor {
					d = e
				}
			}
			if d.Stopper == nil {
				return fmt.Errorf("this runner cannot stop a session of executor %q", ref.Executor)
			}
			var err error
			st, err = d.Stopper(env, executorOptions{Runner: runner, Image: f.Image, Logger: log.With("component", "executor", "executor", d.Name)})
			if err != nil {
				return fmt.Errorf("reach executor %s with its flags: %w", d.Name, err)
			}
			built[ref.Executor] = st
		}
		return st.StopSession(ctx, ref)
	}
}

// executorVars are the kong variables ExecutorFlags' tags use, made from
// the registry.
func executorVars() kong.Vars {
	var f ExecutorFlags
	var enum, help []string
	for _, d := range f.executors() {
		enum = append(enum, d.Name)
		enum = append(enum, d.Aliases...)
		h := d.Name + " (" + d.What
		for _, a := range d.Aliases {
			h += "; " + a + " is an alias"
		}
		help = append(help, h+")")
	}
	return kong.Vars{
		"executor_enum":    strings.Join(enum, ","),
		"executor_help":    strings.Join(help, ", "),
		"executor_default": defaultExecutor,
		// The runner image's name and tag as the flake (nix/image.nix) and
		// deploy/image give them: knotless-run:VERSION (nix/image.json).
		"image_default": "knotless-run:" + version.Version,
	}
}
