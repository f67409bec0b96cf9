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
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/termsafe"
	"knotless.dev/run/internal/rules/control"
	"knotless.dev/run/internal/rules/workflow"
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

// CheckArgs name the check a command acts on: CHECK (or the hidden
// --check of earlier versions), looked for in --repo.
type CheckArgs struct {
	Name   string `arg:"" optional:"" name:"check" help:"The check: at://RUNNER/dev.knotless.check/KEY, RUNNER/KEY, or its key or a unique prefix of it, as knotless-run runs shows it." placeholder:"CHECK" predictor:"check"`
	Check  string `name:"check" hidden:"" help:"The check (as CHECK)." placeholder:"CHECK"`
	Repo   string `help:"Where to look for a check named by its key: at://OWNER-DID/dev.knotless.repo/NAME, OWNER-DID/NAME, or NAME, one of yours (default: every repository of the account you logged in as)." placeholder:"REPO" predictor:"repo"`
	Runner string `help:"Only this runner acts on it (default with a key: every runner that has the check)." placeholder:"DID"`
}

// name is the check as given, once.
func (a *CheckArgs) name() (string, error) {
	switch {
	case a.Name != "" && a.Check != "":
		return "", usageError{errors.New("give the check once: CHECK or --check")}
	case a.Name != "":
		return a.Name, nil
	}
	return a.Check, nil
}

// target is the check a cancel or rerun record names: its key, its
// runner when the record is for one runner only, its repository, and
// the checks read (none with --print, which reads nothing).
type target struct {
	key, runner, repo string
	found             []foundCheck
	f                 *finder
}

// target reads the check the command names. With --print nothing is
// read: the check is named by its AT-URI (or RUNNER/KEY), or by its
// whole key with --repo as an AT-URI. Else it is found on the runners'
// PDSes, and the logged-in account must be allowed to act on it
// (control.May, the rule the runner applies).
func (a *CheckArgs) target(ctx context.Context, env *Env, w *WriteFlags, action control.Action) (target, error) {
	name, err := a.name()
	if err != nil {
		return target{}, err
	}
	if a.Runner != "" {
		if _, err := syntax.ParseDID(a.Runner); err != nil {
			return target{}, usageError{fmt.Errorf("--runner: %w", err)}
		}
	}
	ref, err := parseCheckRef(name)
	if err != nil {
		return target{}, err
	}
	if ref.URI != "" {
		if did := ref.URI.Authority().String(); a.Runner != "" && a.Runner != did {
			return target{}, usageError{fmt.Errorf("--runner %s: the check %s is runner %s's", a.Runner, ref.URI, did)}
		}
	}
	if w.Print {
		t := target{runner: a.Runner, repo: a.Repo}
		if a.Repo != "" {
			if err := checkRepoURI(a.Repo); err != nil {
				return t, usageError{fmt.Errorf("--repo: %w", err)}
			}
		}
		if ref.URI != "" {
			t.key, t.runner = ref.URI.RecordKey().String(), ref.URI.Authority().String()
			return t, nil
		}
		if a.Repo == "" {
			return t, usageError{fmt.Errorf("CHECK %s: with --print, a check's key needs --repo at://OWNER-DID/%s/NAME (or give the check's AT-URI)", name, forge.CollectionRepo)}
		}
		t.key = ref.Prefix
		return t, nil
	}
	acct, err := account(env)
	if err != nil {
		return target{}, err
	}
	var f *finder
	if ref.URI != "" {
		r, err := w.reader(env)
		if err != nil {
			return target{}, err
		}
		f = &finder{r: r}
	} else if f, err = newFinder(ctx, env, &w.ClientFlags, a.Repo); err != nil {
		return target{}, err
	}
	found, err := f.find(ctx, env, ref)
	if err != nil {
		return target{}, err
	}
	if a.Runner != "" {
		found = slices.DeleteFunc(found, func(c foundCheck) bool { return c.Runner != a.Runner })
		if len(found) == 0 {
			return target{}, fmt.Errorf("runner %s has no check %s", a.Runner, name)
		}
	}
	first := found[0].Check
	if err := control.May(acct.DID().String(), action, first.Subject); err != nil {
		return target{}, err
	}
	t := target{key: found[0].Key, runner: a.Runner, repo: first.Subject.Repo, found: found, f: f}
	if ref.URI != "" {
		t.runner = found[0].Runner
	}
	return t, nil
}

// CancelCmd stops a check: it writes (or prints) a dev.knotless.cancel
// record.
type CancelCmd struct {
	WriteFlags `embed:""`
	WaitFlags  `embed:""`
	CheckArgs  `embed:""`
}

// Run writes the cancel record.
func (c *CancelCmd) Run(ctx context.Context, env *Env) error {
	t, err := c.target(ctx, env, &c.WriteFlags, control.Cancel)
	if err != nil {
		return err
	}
	if !c.Print && !slices.ContainsFunc(t.found, func(fc foundCheck) bool { return !fc.Check.Final() }) {
		fc := t.found[0]
		return fmt.Errorf("check %s (%s) has ended already (%s): a cancel never changes a result; nothing written", fc.Key, termsafe.Line(fc.Check.Workflow), termsafe.Line(fc.Check.Status))
	}
	rec := forge.Cancel{Type: forge.CollectionCancel, Check: t.key, Runner: t.runner, Repo: t.repo, CreatedAt: forge.Now()}
	uri, err := c.write(ctx, env, forge.CollectionCancel, forge.CancelKey(t.runner, t.key), rec)
	if err != nil || c.Print || c.NoWait {
		return err
	}
	return waitCancelled(ctx, env, &c.WaitFlags, t.f, t, uri)
}

// RerunCmd runs a check's event again: it writes (or prints) a
// dev.knotless.rerun record.
type RerunCmd struct {
	WriteFlags   `embed:""`
	WaitFlags    `embed:""`
	CheckArgs    `embed:""`
	Workflow     string   `help:"Run only this workflow of the event (default: every one)." placeholder:"NAME" xor:"select"`
	Failed       bool     `help:"Run only the workflows whose last attempt ended failure, error or cancelled." xor:"select"`
	Env          []string `help:"A run variable every step gets (repeatable); not secret, not masked." placeholder:"NAME=VALUE" sep:"none"`
	WorkflowFile string   `help:"Check --env against this workflow file too: no name of a secret it grants." placeholder:"FILE"`
}

// Run writes the rerun record.
func (c *RerunCmd) Run(ctx context.Context, env *Env) error {
	vars, err := parseVars("--env", c.Env)
	if err != nil {
		return err
	}
	var secrets []string
	if c.WorkflowFile != "" {
		wf, err := workflow.Load(c.WorkflowFile)
		if err != nil {
			return usageError{fmt.Errorf("--workflow-file: %w", err)}
		}
		secrets = wf.Secrets
	}
	if err := workflow.CheckRunVars(toEnvVars(vars), secrets); err != nil {
		return usageError{fmt.Errorf("--env: %w", err)}
	}
	t, err := c.target(ctx, env, &c.WriteFlags, control.Rerun)
	if err != nil {
		return err
	}
	rec := forge.Rerun{Type: forge.CollectionRerun, Check: t.key, Runner: t.runner, Repo: t.repo,
		Workflow: c.Workflow, Failed: c.Failed, Env: vars, CreatedAt: forge.Now()}
	uri, err := c.write(ctx, env, forge.CollectionRerun, "", rec)
	if err != nil || c.Print || c.NoWait {
		return err
	}
	return waitRerun(ctx, env, &c.WaitFlags, t.f, t, uri, rec)
}

// DispatchCmd prints a dev.knotless.dispatch record.
type DispatchCmd struct {
	WriteFlags   `embed:""`
	WaitFlags    `embed:""`
	Repo         string   `help:"The repository: at://OWNER-DID/dev.knotless.repo/NAME, OWNER-DID/NAME, or NAME, one of yours." required:"" placeholder:"REPO" predictor:"repo"`
	Ref          string   `help:"The branch to run on: its name or refs/heads/NAME." required:"" placeholder:"REF"`
	Workflow     string   `help:"The workflow's name, its file stem (default: the stem of --workflow-file)." placeholder:"NAME"`
	Input        []string `short:"f" help:"An input's value (repeatable); a boolean's is true or false." placeholder:"NAME=VALUE" sep:"none"`
	Runner       string   `help:"Only this runner runs it (default: every runner the repository names that runs the workflow)." placeholder:"DID"`
	WorkflowFile string   `help:"Check the inputs against this workflow file: on: dispatch, its inputs' names, types, options and required ones." placeholder:"FILE"`
}

// Run prints the dispatch record.
func (c *DispatchCmd) Run(ctx context.Context, env *Env) error {
	repo, err := repoURI(env, c.Repo)
	if err != nil {
		return err
	}
	c.Repo = repo
	ref := c.Ref
	if !strings.HasPrefix(ref, "refs/") {
		ref = "refs/heads/" + ref
	}
	if b, ok := strings.CutPrefix(ref, "refs/heads/"); !ok || b == "" {
		return usageError{fmt.Errorf("--ref %q: want a branch, NAME or refs/heads/NAME", c.Ref)}
	}
	if c.Runner != "" {
		if _, err := syntax.ParseDID(c.Runner); err != nil {
			return usageError{fmt.Errorf("--runner: %w", err)}
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
			return usageError{fmt.Errorf("--workflow-file: %w", err)}
		}
		switch {
		case name == "":
			name = wf.Name
		case name != wf.Name:
			return usageError{fmt.Errorf("--workflow %s: --workflow-file %s is workflow %s", name, c.WorkflowFile, wf.Name)}
		}
		if !wf.Matches(workflow.Dispatch, strings.TrimPrefix(ref, "refs/heads/")) {
			if !slices.Contains(wf.On, workflow.Dispatch) {
				return usageError{fmt.Errorf("--workflow-file %s: workflow %s does not run on dispatch (on: dispatch)", c.WorkflowFile, wf.Name)}
			}
			return usageError{fmt.Errorf("--ref %s: workflow %s does not run for this branch (branches: %s)", ref, wf.Name, strings.Join(wf.Branches, ", "))}
		}
		if _, err := wf.DispatchVars(toEnvVars(inputs)); err != nil {
			return usageError{fmt.Errorf("--input: %w", err)}
		}
	}
	if name == "" {
		return usageError{errors.New("--workflow: name the workflow (or give --workflow-file)")}
	}
	rec := forge.Dispatch{Type: forge.CollectionDispatch, Repo: c.Repo, Ref: ref, Workflow: name, Runner: c.Runner,
		Inputs: inputs, CreatedAt: forge.Now()}
	var runners []string
	var r *pdsclient.Reader
	if !c.Print && !c.NoWait {
		// Read before writing: a repository that cannot be read, or
		// that is not the account's, is said before anything is written.
		acct, err := account(env)
		if err != nil {
			return err
		}
		if err := control.May(acct.DID().String(), control.Dispatch, forge.Subject{Repo: c.Repo}); err != nil {
			return err
		}
		if r, err = c.reader(env); err != nil {
			return err
		}
		var repo forge.Repo
		if _, err := r.Get(ctx, syntax.ATURI(c.Repo), &repo); err != nil {
			return fmt.Errorf("--repo: %w", err)
		}
		runners = repo.Runners
		if c.Runner != "" {
			runners = []string{c.Runner}
		}
		if len(runners) == 0 {
			return fmt.Errorf("--repo %s names no runner", c.Repo)
		}
	}
	uri, err := c.write(ctx, env, forge.CollectionDispatch, "", rec)
	if err != nil || c.Print || c.NoWait {
		return err
	}
	return waitDispatch(ctx, env, &c.WaitFlags, r, runners, uri, rec)
}

// repoURI is the AT-URI of the repository --repo names: an AT-URI,
// OWNER-DID/NAME, or NAME, a repository of the logged-in account.
func repoURI(env *Env, s string) (string, error) {
	if !strings.HasPrefix(s, "at://") && !strings.Contains(s, "/") && s != "" {
		sess, _, err := loadSession(env)
		if err != nil {
			return "", usageError{fmt.Errorf("--repo %s: a repository named by its name alone is one of yours: log in, or give at://OWNER-DID/%s/NAME: %w", s, forge.CollectionRepo, err)}
		}
		return forge.RepoURI(sess.AccountDID, s).String(), nil
	}
	t, err := ingest.ParseTarget(s)
	if err != nil || !t.Owner.IsDID() {
		return "", usageError{fmt.Errorf("--repo: repo %q: want at://OWNER-DID/%s/NAME, OWNER-DID/NAME or NAME", s, forge.CollectionRepo)}
	}
	return forge.RepoURI(syntax.DID(t.Owner.String()), t.Name).String(), nil
}

// parseVars reads NAME=VALUE arguments of flag.
func parseVars(flag string, args []string) ([]forge.Variable, error) {
	var out []forge.Variable
	for _, a := range args {
		name, value, ok := strings.Cut(a, "=")
		if !ok {
			return nil, usageError{fmt.Errorf("%s %q: want NAME=VALUE", flag, a)}
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
		return "", printRecord(env, collection, rkey, rec, f.writer(collection))
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

// writer says whose repo a record of collection must be in to act.
func (f *WriteFlags) writer(collection string) string {
	switch collection {
	case forge.CollectionCancel, forge.CollectionRerun:
		return "the repository's owner or, for a pull's check, its author"
	case forge.CollectionSecret:
		return "the repository's owner"
	}
	return "the repository's owner (only the owner's dispatch records are read)"
}

// printRecord validates rec as a record of collection, prints it as JSON
// on stdout, and on stderr the call that writes it: putRecord with rkey
// when the key is derived (writing it again is the same record),
// createRecord otherwise (the PDS gives it a TID).
func printRecord(env *Env, collection, rkey string, rec any, who string) error {
	cat, err := pdsclient.NewCatalog()
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
	fmt.Fprintf(env.Stderr, "knotless-run: write RECORD (above) in your own atproto repo, %s: %s\n", who, call)
	return nil
}
