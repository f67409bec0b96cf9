package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/termsafe"
	"knotless.dev/run/internal/workflow"
)

// The run-control commands write a record in the logged-in account's
// own atproto repo (the runner reads, the owner writes), or with --print
// print it, as secret seal does: the record on stdout, the call that
// writes it on stderr. They check locally what can be checked without
// the network.

// WriteFlags are what every command that writes a record takes.
type WriteFlags struct {
	ClientFlags `embed:""`
	Print       bool `help:"Print the record (and, on stderr, the call that writes it) instead of writing it with the session of login."`
}

// CancelCmd prints a dev.knotless.cancel record.
type CancelCmd struct {
	WriteFlags `embed:""`
	URI        string `arg:"" optional:"" name:"check-uri" help:"The check: at://RUNNER/dev.knotless.check/KEY." placeholder:"CHECK-URI"`
	Check      string `help:"The check's record key (the same on every runner that has the work), in place of CHECK-URI." placeholder:"KEY"`
	Repo       string `help:"The check's repository: at://OWNER-DID/dev.knotless.repo/NAME (required with --check)." placeholder:"AT-URI"`
	Runner     string `help:"Only this runner acts on it (default with --check: every runner that has the check)." placeholder:"DID"`
}

// Run prints the cancel record.
func (c *CancelCmd) Run(ctx context.Context, env *Env) error {
	t, err := checkTarget(c.URI, c.Check, c.Repo, c.Runner, "check-uri")
	if err != nil {
		return err
	}
	rec := forge.Cancel{Type: forge.CollectionCancel, Check: t.key, Runner: t.runner, Repo: c.Repo, CreatedAt: forge.Now()}
	_, err = c.write(ctx, env, forge.CollectionCancel, forge.CancelKey(t.runner, t.key), rec)
	return err
}

// RerunCmd prints a dev.knotless.rerun record.
type RerunCmd struct {
	WriteFlags   `embed:""`
	Check        string   `help:"The check whose event to run again: its AT-URI, at://RUNNER/dev.knotless.check/KEY, or its record key with --repo." required:"" placeholder:"CHECK"`
	Repo         string   `help:"The check's repository: at://OWNER-DID/dev.knotless.repo/NAME (required with a key)." placeholder:"AT-URI"`
	Runner       string   `help:"Only this runner acts on it (default with a key: every runner that has the check)." placeholder:"DID"`
	Workflow     string   `help:"Run only this workflow of the event (default: every one)." placeholder:"NAME" xor:"select"`
	Failed       bool     `help:"Run only the workflows whose last attempt ended failure, error or cancelled." xor:"select"`
	Env          []string `help:"A run variable every step gets (repeatable); not secret, not masked." placeholder:"NAME=VALUE" sep:"none"`
	WorkflowFile string   `help:"Check --env against this workflow file too: no name of a secret it grants." placeholder:"FILE"`
}

// Run prints the rerun record.
func (c *RerunCmd) Run(ctx context.Context, env *Env) error {
	t, err := checkTarget(c.Check, "", c.Repo, c.Runner, "check")
	if err != nil {
		return err
	}
	vars, err := parseVars("--env", c.Env)
	if err != nil {
		return err
	}
	var secrets []string
	if c.WorkflowFile != "" {
		wf, err := workflow.Load(c.WorkflowFile)
		if err != nil {
			return fmt.Errorf("--workflow-file: %w", err)
		}
		secrets = wf.Secrets
	}
	if err := workflow.CheckRunVars(toEnvVars(vars), secrets); err != nil {
		return fmt.Errorf("--env: %w", err)
	}
	rec := forge.Rerun{Type: forge.CollectionRerun, Check: t.key, Runner: t.runner, Repo: c.Repo,
		Workflow: c.Workflow, Failed: c.Failed, Env: vars, CreatedAt: forge.Now()}
	_, err = c.write(ctx, env, forge.CollectionRerun, "", rec)
	return err
}

// DispatchCmd prints a dev.knotless.dispatch record.
type DispatchCmd struct {
	WriteFlags   `embed:""`
	Repo         string   `help:"The repository: at://OWNER-DID/dev.knotless.repo/NAME." required:"" placeholder:"AT-URI"`
	Ref          string   `help:"The branch to run on: its name or refs/heads/NAME." required:"" placeholder:"REF"`
	Workflow     string   `help:"The workflow's name, its file stem (default: the stem of --workflow-file)." placeholder:"NAME"`
	Input        []string `help:"An input's value (repeatable); a boolean's is true or false." placeholder:"NAME=VALUE" sep:"none"`
	Runner       string   `help:"Only this runner runs it (default: every runner the repository names that runs the workflow)." placeholder:"DID"`
	WorkflowFile string   `help:"Check the inputs against this workflow file: on: dispatch, its inputs' names, types, options and required ones." placeholder:"FILE"`
}

// Run prints the dispatch record.
func (c *DispatchCmd) Run(ctx context.Context, env *Env) error {
	if err := checkRepoURI(c.Repo); err != nil {
		return fmt.Errorf("--repo: %w", err)
	}
	ref := c.Ref
	if !strings.HasPrefix(ref, "refs/") {
		ref = "refs/heads/" + ref
	}
	if b, ok := strings.CutPrefix(ref, "refs/heads/"); !ok || b == "" {
		return fmt.Errorf("--ref %q: want a branch, NAME or refs/heads/NAME", c.Ref)
	}
	if c.Runner != "" {
		if _, err := syntax.ParseDID(c.Runner); err != nil {
			return fmt.Errorf("--runner: %w", err)
		}
	}
	inputs, err := parseVars("--input", c.Input)
	if err != nil {
		return err
	}
	name := c.Workflow
	if c.WorkflowFile != "" {
		wf, err := workflow.Load(c.WorkflowFile)
		if err != nil {
			return fmt.Errorf("--workflow-file: %w", err)
		}
		switch {
		case name == "":
			name = wf.Name
		case name != wf.Name:
			return fmt.Errorf("--workflow %s: --workflow-file %s is workflow %s", name, c.WorkflowFile, wf.Name)
		}
		if !wf.Matches(workflow.Dispatch, strings.TrimPrefix(ref, "refs/heads/")) {
			if !slices.Contains(wf.On, workflow.Dispatch) {
				return fmt.Errorf("--workflow-file %s: workflow %s does not run on dispatch (on: dispatch)", c.WorkflowFile, wf.Name)
			}
			return fmt.Errorf("--ref %s: workflow %s does not run for this branch (branches: %s)", ref, wf.Name, strings.Join(wf.Branches, ", "))
		}
		if _, err := wf.DispatchVars(toEnvVars(inputs)); err != nil {
			return fmt.Errorf("--input: %w", err)
		}
	}
	if name == "" {
		return errors.New("--workflow: name the workflow (or give --workflow-file)")
	}
	rec := forge.Dispatch{Type: forge.CollectionDispatch, Repo: c.Repo, Ref: ref, Workflow: name, Runner: c.Runner,
		Inputs: inputs, CreatedAt: forge.Now()}
	_, err = c.write(ctx, env, forge.CollectionDispatch, "", rec)
	return err
}

// target is the check a cancel or rerun names: its key, and its runner
// when the record is for one runner only.
type target struct {
	key, runner string
}

// checkTarget reads the check a cancel or rerun names: the AT-URI of a
// check record (its runner and key), or a record key with --repo. flag
// is how the user wrote it (a positional or --check).
func checkTarget(value, key, repo, runner, flag string) (target, error) {
	var t target
	if repo != "" {
		if err := checkRepoURI(repo); err != nil {
			return t, fmt.Errorf("--repo: %w", err)
		}
	}
	if runner != "" {
		if _, err := syntax.ParseDID(runner); err != nil {
			return t, fmt.Errorf("--runner: %w", err)
		}
	}
	switch {
	case value != "" && key != "":
		return t, fmt.Errorf("give the check once: %s or --check", strings.ToUpper(flag))
	case value == "" && key == "":
		return t, fmt.Errorf("name the check: %s (at://RUNNER/%s/KEY), or --check KEY with --repo", strings.ToUpper(flag), forge.CollectionCheck)
	case key == "" && strings.HasPrefix(value, "at://"):
		u, err := syntax.ParseATURI(value)
		if err != nil || u.Collection().String() != forge.CollectionCheck || u.RecordKey() == "" {
			return t, fmt.Errorf("%s %q: want at://RUNNER-DID/%s/KEY", flagName(flag), value, forge.CollectionCheck)
		}
		did, err := u.Authority().AsDID()
		if err != nil {
			return t, fmt.Errorf("%s %q: name the runner by its DID, not a handle", flagName(flag), value)
		}
		if runner != "" && runner != did.String() {
			return t, fmt.Errorf("--runner %s: the check %s is runner %s's", runner, value, did)
		}
		return target{key: u.RecordKey().String(), runner: did.String()}, nil
	}
	name := "--check"
	if key == "" {
		key, name = value, flagName(flag)
	}
	if _, err := syntax.ParseRecordKey(key); err != nil {
		return t, fmt.Errorf("%s %q: not a check's AT-URI or record key: %w", name, key, err)
	}
	if repo == "" {
		return t, fmt.Errorf("%s %s: a check's key needs --repo (or give the check's AT-URI)", name, key)
	}
	return target{key: key, runner: runner}, nil
}

func flagName(flag string) string {
	if flag == "check" {
		return "--check"
	}
	return strings.ToUpper(flag)
}

// parseVars reads NAME=VALUE arguments of flag.
func parseVars(flag string, args []string) ([]forge.Variable, error) {
	var out []forge.Variable
	for _, a := range args {
		name, value, ok := strings.Cut(a, "=")
		if !ok {
			return nil, fmt.Errorf("%s %q: want NAME=VALUE", flag, a)
		}
		out = append(out, forge.Variable{Name: name, Value: value})
	}
	return out, nil
}

func toEnvVars(vs []forge.Variable) []workflow.EnvVar {
	out := make([]workflow.EnvVar, len(vs))
	for i, v := range vs {
		out[i] = workflow.EnvVar{Name: v.Name, Value: v.Value}
	}
	return out
}

// write writes rec in the logged-in account's repo (putRecord at rkey
// when the key is derived, else a new TID key) and says so; with --print
// it prints it instead and returns "".
func (f *WriteFlags) write(ctx context.Context, env *Env, collection, rkey string, rec any) (syntax.ATURI, error) {
	if f.Print {
		return "", printRecord(env, collection, rkey, rec)
	}
	acct, err := account(env)
	if err != nil {
		return "", err
	}
	if rkey == "" {
		rkey = syntax.NewTIDNow(0).String()
	}
	uri, err := acct.Put(ctx, collection, rkey, rec)
	if err != nil {
		return "", fmt.Errorf("write the %s record: %w", collection, err)
	}
	fmt.Fprintf(env.Stderr, "knotless-run: wrote %s\n", uri)
	return uri, nil
}

// printRecord validates rec as a record of collection, prints it as JSON
// on stdout, and on stderr the call that writes it: putRecord with rkey
// when the key is derived (writing it again is the same record),
// createRecord otherwise (the PDS gives it a TID).
func printRecord(env *Env, collection, rkey string, rec any) error {
	cat, err := forge.NewCatalog()
	if err != nil {
		return err
	}
	if _, err := cat.Encode(collection, rec); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s record: %w", collection, err)
	}
	// The record may name a workflow from a file someone else wrote:
	// what a terminal would act on is shown as JSON escapes, the same
	// record.
	fmt.Fprintf(env.Stdout, "%s\n", termsafe.JSON(b))
	call := fmt.Sprintf(`com.atproto.repo.createRecord {"repo": "YOUR-DID", "collection": %q, "validate": false, "record": RECORD}`, collection)
	if rkey != "" {
		call = fmt.Sprintf(`com.atproto.repo.putRecord {"repo": "YOUR-DID", "collection": %q, "rkey": %q, "validate": false, "record": RECORD}`, collection, rkey)
	}
	fmt.Fprintf(env.Stderr, "knotless-run: write RECORD (above) in your own atproto repo, the repository's owner or, for a pull's check, its author: %s\n", call)
	return nil
}
