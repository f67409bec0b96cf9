package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/workflow"
)

// RunCmd runs one workflow ad hoc.
type RunCmd struct {
	Workflow  string   `help:"Workflow file to run." placeholder:"FILE" xor:"source" required:""`
	StepsFile string   `help:"Steps as lines of name<TAB>script, in place of --workflow." placeholder:"FILE" xor:"source" required:""`
	Workdir   string   `help:"The checkout: put at the run's work directory." default:"." placeholder:"DIR"`
	Outputs   string   `help:"Directory that receives what the steps write to $$KNOTLESS_RUN_OUTPUTS." placeholder:"DIR"`
	Result    string   `help:"Write the result as JSON to FILE (- for stdout, which then carries it alone: the steps' output goes to stderr)." placeholder:"FILE"`
	Log       string   `help:"Write the masked run log (capped at 1 MB) to FILE." placeholder:"FILE"`
	DryRun    bool     `help:"Print what would be sent for each step (secret values masked) and run nothing."`
	Keep      bool     `help:"Keep the run's session (Job, container or directory) for debugging."`
	Secret    []string `help:"Grant secret NAME with its value from the environment variable NAME, or NAME=@FILE to read it from FILE. A value is never taken from the command line." placeholder:"NAME"`
	Untrusted bool     `help:"Run as untrusted code (a pull): no secret is given to any step."`
	Event     string   `help:"The event kind the steps' conditions (if:) read as event.kind; with pull, event.base is --ref's branch." enum:"push,pull,batch,dispatch,schedule" default:"push" placeholder:"KIND"`
	Ref       string   `help:"The ref the steps' conditions read as event.ref (and event.branch or event.tag)." placeholder:"REF"`
	RunID     string   `help:"The run's id (default: generated)." placeholder:"ID"`
	Leg       int      `help:"Of a workflow with a matrix, the leg to run: its number, from 1, as validate lists them." default:"1" placeholder:"N"`
	Runner    string   `help:"The runner's DID: labels every object a run makes." default:"did:web:localhost"`
	CacheDir  string   `help:"Keep the workflow's caches in the store under DIR (serve's --cache-dir, to share the daemon's): the checkout directory names the repository (default: none, no caches)." placeholder:"DIR" group:"caches"`

	// ExecutorFlags choose and configure the executor.
	ExecutorFlags `embed:""`
	// LimitFlags bound every run of `run`, trusted or not.
	LimitFlags `embed:""`
	// BoundFlags bound every run's transfers.
	BoundFlags `embed:""`
	// CacheFlags bound the cache store of --cache-dir.
	CacheFlags `embed:""`
}

// Run runs the workflow and exits with the run's status.
func (c *RunCmd) Run(ctx context.Context, env *Env) error {
	wf, err := c.loadWorkflow()
	if err != nil {
		return err
	}
	secrets, err := c.readSecrets(env)
	if err != nil {
		return err
	}
	runID := c.RunID
	if runID == "" {
		runID = run.NewID()
	}
	max, err := c.maximums(true)
	if err != nil {
		return err
	}
	classes, err := c.classes()
	if err != nil {
		return err
	}
	// A dry run starts nothing, so it needs no executor (and no
	// cluster credentials).
	var exec executor.Executor
	if !c.DryRun {
		if exec, err = c.newExecutor(env, c.Runner, 1, c.transfer(c.CacheMax), env.Logger, nil); err != nil {
			return err
		}
	}
	checkoutBound, outputsBound := c.bounds()
	caches, scope, err := c.caches()
	if err != nil {
		return err
	}
	// The verdict is printed as soon as the run has it; the session is
	// removed after it, and waited for before the command returns.
	cleaner := run.NewCleaner(env.Logger.With("component", "run"))
	eng := run.New(run.Config{
		Executor:     exec,
		Runner:       c.Runner,
		Logger:       env.Logger.With("component", "run"),
		DefaultImage: c.Image,
		Max:          max,
		Classes:      classes,
		Checkout:     checkoutBound,
		Outputs:      outputsBound,
		Caches:       caches,
		Cleaner:      cleaner,
	})
	// The steps' output and the closing line go to stdout, unless the
	// result does: then stdout carries the JSON alone and they go to
	// stderr, with the logs.
	out := env.Stdout
	if c.Result == "-" {
		out = env.Stderr
	}
	req := run.Request{
		RunID:    runID,
		Workflow: wf,
		Checkout: c.Workdir,
		Outputs:  c.Outputs,
		Secrets:  secrets,
		Trusted:  !c.Untrusted,
		Event:    c.condEvent(),
		Keep:     c.Keep,
		Live:     out,
		Cache:    scope,
	}
	if c.DryRun {
		return c.dryRun(env, eng, req)
	}
	res := eng.Run(ctx, req)
	// Each clean-up is bounded by the engine's CleanupTimeout, also
	// when ctx ends (an interrupt): nothing is left behind on return.
	defer func() { _ = cleaner.Wait(context.WithoutCancel(ctx)) }()
	if err := c.writeResult(env, res); err != nil {
		return err
	}
	fmt.Fprintf(out, "knotless-run: workflow %s: %s", res.Workflow, res.Status)
	if res.Error != "" {
		fmt.Fprintf(out, ": %s", res.Error)
	}
	fmt.Fprintf(out, " (%s)\n", res.FinishedAt.Sub(res.StartedAt).Round(time.Millisecond))
	return exitError{statusCode(res.Status)}
}

// caches opens --cache-dir's store. The checkout's absolute path names
// the repository; a later run orders above an earlier one.
func (c *RunCmd) caches() (run.Caches, run.CacheScope, error) {
	if c.CacheDir == "" || c.DryRun {
		return nil, run.CacheScope{}, nil
	}
	s, err := c.openCaches(c.CacheDir)
	if err != nil {
		return nil, run.CacheScope{}, err
	}
	repo, err := filepath.Abs(c.Workdir)
	if err != nil {
		return nil, run.CacheScope{}, fmt.Errorf("--workdir: %w", err)
	}
	return s, run.CacheScope{Repo: repo, Order: time.Now().UTC().Format("20060102T150405.000000000Z")}, nil
}

func statusCode(s run.Status) int {
	switch s {
	case run.Success, run.Skipped: // skipped: its path filters left it out, which is no failure
		return ExitSuccess
	case run.Failure:
		return ExitFailure
	case run.Cancelled:
		return ExitCancelled
	default:
		return ExitError
	}
}

func (c *RunCmd) loadWorkflow() (*workflow.Workflow, error) {
	if c.Workflow != "" {
		wf, err := workflow.Load(c.Workflow)
		if err != nil {
			return nil, fmt.Errorf("--workflow %s:\n%w", c.Workflow, err)
		}
		legs := wf.Legs()
		if c.Leg < 1 || c.Leg > len(legs) {
			return nil, usageError{fmt.Errorf("--leg %d: %s has %d legs (from 1)", c.Leg, c.Workflow, len(legs))}
		}
		return legs[c.Leg-1], nil
	}
	return loadStepsFile(c.StepsFile)
}

// loadStepsFile reads the proof of concept's format: one step a line,
// name<TAB>script.
func loadStepsFile(name string) (*workflow.Workflow, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("--steps-file: %w", err)
	}
	defer f.Close()
	wf := &workflow.Workflow{
		Name: strings.TrimSuffix(filepath.Base(name), filepath.Ext(name)),
		File: name,
		On:   []workflow.Trigger{workflow.Push},
	}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if strings.TrimSpace(text) == "" || strings.HasPrefix(text, "#") {
			continue
		}
		stepName, script, ok := strings.Cut(text, "\t")
		if !ok || stepName == "" || script == "" {
			return nil, fmt.Errorf("--steps-file %s:%d: want name<TAB>script", name, line)
		}
		wf.Steps = append(wf.Steps, workflow.Step{Name: stepName, Run: script, Line: line})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--steps-file %s: %w", name, err)
	}
	if len(wf.Steps) == 0 {
		return nil, fmt.Errorf("--steps-file %s: no steps", name)
	}
	return wf, nil
}

// readSecrets reads each --secret's value from the environment or a file.
func (c *RunCmd) readSecrets(env *Env) (map[string]string, error) {
	secrets := map[string]string{}
	for _, s := range c.Secret {
		name, source, hasSource := strings.Cut(s, "=")
		switch {
		case !hasSource:
			v := env.Getenv(name)
			if v == "" {
				return nil, usageError{fmt.Errorf("--secret %s: the environment variable %s is empty or unset", name, name)}
			}
			secrets[name] = v
		case strings.HasPrefix(source, "@"):
			b, err := os.ReadFile(source[1:])
			if err != nil {
				return nil, fmt.Errorf("--secret %s: %w", name, err)
			}
			secrets[name] = strings.TrimSuffix(string(b), "\n")
		default:
			return nil, usageError{fmt.Errorf("--secret %s: a value is never taken from the command line; use --secret %s (environment) or --secret %s=@FILE", name, name, name)}
		}
	}
	return secrets, nil
}

func (c *RunCmd) dryRun(env *Env, eng *run.Engine, req run.Request) error {
	d, err := c.lookup()
	if err != nil {
		return err
	}
	payloads, err := eng.DryRun(req, d.Dirs)
	if err != nil {
		return err
	}
	if d.DryRun != nil {
		if err := d.DryRun(env, executorOptions{Runner: c.Runner, Image: c.Image}, eng.SessionSpec(req), req.Secrets); err != nil {
			return err
		}
	}
	for i, p := range payloads {
		fmt.Fprintf(env.Stdout, "# step %d/%d: %s (sent to sh on stdin)\n%s\n", i+1, len(payloads), req.Workflow.Steps[i].Name, p)
	}
	return nil
}

func (c *RunCmd) writeResult(env *Env, res *run.Result) error {
	if c.Log != "" {
		if err := os.WriteFile(c.Log, res.Log, 0o600); err != nil {
			return fmt.Errorf("--log: %w", err)
		}
	}
	if c.Result == "" {
		return nil
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	b = append(b, '\n')
	var w io.Writer = env.Stdout
	if c.Result != "-" {
		f, err := os.OpenFile(c.Result, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("--result: %w", err)
		}
		defer f.Close()
		w = f
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("--result: %w", err)
	}
	return nil
}

// condEvent is the event the steps' conditions read: --event, --ref and
// the run's trust.
func (c *RunCmd) condEvent() workflow.CondEvent {
	ev := workflow.CondEvent{Kind: c.Event, Ref: c.Ref, Trusted: !c.Untrusted}
	if c.Event == "pull" {
		ev.Base = strings.TrimPrefix(c.Ref, "refs/heads/")
	}
	return ev
}
