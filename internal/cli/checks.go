package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/termsafe"
)

// defaultPLC is the did:plc directory when neither --plc-url nor the
// login's says another.
const defaultPLC = "https://plc.directory"

// plc is the directory to resolve DIDs with.
func (f *ClientFlags) plc(env *Env) string {
	if f.PLCURL != "" {
		return f.PLCURL
	}
	if s, _, err := loadSession(env); err == nil && s.PLCURL != "" {
		return s.PLCURL
	}
	return defaultPLC
}

// reader reads anyone's records, resolving DIDs with the directory.
func (f *ClientFlags) reader(env *Env) (*pdsclient.Reader, error) {
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		return nil, err
	}
	return &pdsclient.Reader{Dir: pdsclient.NewDirectory(pdsclient.DirectoryConfig{PLCURL: f.plc(env)}), Catalog: cat,
		HTTP: &http.Client{Timeout: time.Minute}}, nil
}

// checkRef is a check as the command line names it: the AT-URI of its
// record (from at://DID/dev.knotless.check/KEY or DID/KEY), or a record
// key or a prefix of one, found among the checks of the repositories
// in scope (--repo, else the logged-in account's).
type checkRef struct {
	URI    syntax.ATURI
	Prefix string
}

// parseCheckRef reads CHECK, the one way every command names a check.
func parseCheckRef(s string) (checkRef, error) {
	switch {
	case s == "":
		return checkRef{}, usageError{errors.New("name the check: at://RUNNER/dev.knotless.check/KEY, RUNNER/KEY, or its key (or a unique prefix of it, as `knotless-run runs` shows)")}
	case strings.HasPrefix(s, "at://"):
	case strings.Contains(s, "/"):
		did, key, _ := strings.Cut(s, "/")
		s = "at://" + did + "/" + forge.CollectionCheck + "/" + key
	default:
		if _, err := syntax.ParseRecordKey(s); err != nil {
			return checkRef{}, usageError{fmt.Errorf("CHECK %q: not a check's AT-URI, RUNNER/KEY or key: %w", s, err)}
		}
		return checkRef{Prefix: s}, nil
	}
	uri, err := syntax.ParseATURI(s)
	if err != nil || uri.Collection().String() != forge.CollectionCheck || uri.RecordKey() == "" {
		return checkRef{}, usageError{fmt.Errorf("CHECK %q: want at://RUNNER-DID/%s/KEY or RUNNER-DID/KEY", s, forge.CollectionCheck)}
	}
	if _, err := uri.Authority().AsDID(); err != nil {
		return checkRef{}, usageError{fmt.Errorf("CHECK %q: name the runner by its DID, not a handle", s)}
	}
	return checkRef{URI: uri}, nil
}

// foundCheck is a check record read from its runner's PDS.
type foundCheck struct {
	URI    syntax.ATURI
	Runner string
	Key    string
	Check  forge.Check
}

// finder reads checks: one by its AT-URI, or the checks of the
// repositories in scope from the runners their records name.
type finder struct {
	r     *pdsclient.Reader
	repos []forge.Record[forge.Repo]
}

// RepoFlag is the repositories a command looks in.
type RepoFlag struct {
	Repo string `help:"The repository: at://OWNER-DID/dev.knotless.repo/NAME, OWNER-DID/NAME, or NAME, one of yours (default: every repository of the account you logged in as)." placeholder:"REPO" predictor:"repo"`
}

// newFinder reads the repository records of scope: --repo, else every
// repository of the logged-in account.
func newFinder(ctx context.Context, env *Env, cf *ClientFlags, repo string) (*finder, error) {
	r, err := cf.reader(env)
	if err != nil {
		return nil, err
	}
	f := &finder{r: r}
	var owner syntax.DID
	name := ""
	switch {
	case repo != "" && (strings.HasPrefix(repo, "at://") || strings.Contains(repo, "/")):
		t, err := ingest.ParseTarget(repo)
		if err != nil {
			return nil, usageError{fmt.Errorf("--repo: %w", err)}
		}
		if !t.Owner.IsDID() {
			return nil, usageError{fmt.Errorf("--repo %q: name the owner by their DID", repo)}
		}
		owner, name = syntax.DID(t.Owner.String()), t.Name
	default:
		s, _, err := loadSession(env)
		if err != nil {
			return nil, fmt.Errorf("which repository? give --repo at://OWNER-DID/%s/NAME, or log in to use yours: %w", forge.CollectionRepo, err)
		}
		owner, name = s.AccountDID, repo
	}
	if name != "" {
		uri := forge.RepoURI(owner, name)
		var rec forge.Repo
		if _, err := r.Get(ctx, uri, &rec); err != nil {
			return nil, fmt.Errorf("--repo: %w", err)
		}
		f.repos = []forge.Record[forge.Repo]{{URI: uri, Value: rec}}
		return f, nil
	}
	repos, _, err := pdsclient.List[forge.Repo](ctx, r, owner, forge.CollectionRepo)
	if err != nil {
		return nil, fmt.Errorf("list the repositories of %s: %w", owner, err)
	}
	if len(repos) == 0 {
		return nil, fmt.Errorf("%s has no repository (%s record): give --repo", owner, forge.CollectionRepo)
	}
	f.repos = repos
	return f, nil
}

// get reads one check by its AT-URI.
func (f *finder) get(ctx context.Context, uri syntax.ATURI) (foundCheck, error) {
	var c forge.Check
	if _, err := f.r.Get(ctx, uri, &c); err != nil {
		return foundCheck{}, fmt.Errorf("read check: %w", err)
	}
	return foundCheck{URI: uri, Runner: uri.Authority().String(), Key: uri.RecordKey().String(), Check: c}, nil
}

// all lists the checks of the repositories in scope, from every runner
// their records name, newest first. A runner whose checks do not list
// is a warning: the others are still shown.
func (f *finder) all(ctx context.Context, env *Env) ([]foundCheck, error) {
	inScope := map[string]bool{}
	var runners []string
	for _, r := range f.repos {
		inScope[r.URI.String()] = true
		for _, d := range r.Value.Runners {
			if !slices.Contains(runners, d) {
				runners = append(runners, d)
			}
		}
	}
	var out []foundCheck
	var errs []error
	for _, d := range runners {
		did, err := syntax.ParseDID(d)
		if err != nil {
			continue
		}
		recs, _, err := pdsclient.List[forge.Check](ctx, f.r, did, forge.CollectionCheck)
		if err != nil {
			errs = append(errs, fmt.Errorf("runner %s: %w", did, err))
			env.Logger.Warn("the checks of a runner do not list", "runner", did.String(), "err", err)
			if recs == nil {
				continue
			}
		}
		for _, rec := range recs {
			if inScope[rec.Value.Subject.Repo] {
				out = append(out, foundCheck{URI: rec.URI, Runner: did.String(), Key: rec.URI.RecordKey().String(), Check: rec.Value})
			}
		}
	}
	if len(out) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Check.CreatedAt > out[j].Check.CreatedAt })
	return out, nil
}

// find reads the check ref names: its record, or the checks in scope
// whose key it is or begins. Several runners may have a check of the
// same key (the same work); two keys are ambiguous.
func (f *finder) find(ctx context.Context, env *Env, ref checkRef) ([]foundCheck, error) {
	if ref.URI != "" {
		c, err := f.get(ctx, ref.URI)
		if err != nil {
			return nil, err
		}
		return []foundCheck{c}, nil
	}
	all, err := f.all(ctx, env)
	if err != nil {
		return nil, err
	}
	var out []foundCheck
	keys := map[string]foundCheck{}
	for _, c := range all {
		if strings.HasPrefix(c.Key, ref.Prefix) {
			out = append(out, c)
			keys[c.Key] = c
		}
	}
	switch {
	case len(keys) == 0:
		return nil, fmt.Errorf("no check %s in %s (knotless-run runs lists them)", ref.Prefix, f.scope())
	case len(keys) > 1:
		var names []string
		for k, c := range keys {
			names = append(names, fmt.Sprintf("%s (%s)", k, termsafe.Line(c.Check.Workflow)))
		}
		sort.Strings(names)
		return nil, usageError{fmt.Errorf("CHECK %s is the start of %d checks' keys: %s; give more of it", ref.Prefix, len(keys), strings.Join(names, ", "))}
	}
	return out, nil
}

func (f *finder) scope() string {
	var s []string
	for _, r := range f.repos {
		s = append(s, r.URI.String())
	}
	return strings.Join(s, ", ")
}

// resolveOne is the check a command that follows one run names: the
// newest of the runners' checks of that key.
func resolveOne(ctx context.Context, env *Env, cf *ClientFlags, repo, name string) (*finder, foundCheck, error) {
	ref, err := parseCheckRef(name)
	if err != nil {
		return nil, foundCheck{}, err
	}
	var f *finder
	if ref.URI != "" {
		r, err := cf.reader(env)
		if err != nil {
			return nil, foundCheck{}, err
		}
		f = &finder{r: r}
	} else if f, err = newFinder(ctx, env, cf, repo); err != nil {
		return nil, foundCheck{}, err
	}
	found, err := f.find(ctx, env, ref)
	if err != nil {
		return nil, foundCheck{}, err
	}
	return f, found[0], nil
}

// RunsCmd lists the checks of a repository.
type RunsCmd struct {
	ClientFlags `embed:""`
	RepoFlag    `embed:""`
	Branch      string `help:"Only the checks of this branch." placeholder:"BRANCH"`
	Status      string `help:"Only the checks of this status: queued, running, success, failure, error or cancelled." enum:"queued,running,success,failure,error,cancelled," default:"" placeholder:"STATUS"`
	Limit       int    `help:"Show at most N checks. (default ${default})" default:"20" placeholder:"N"`
	JSON        bool   `name:"json" help:"Print the checks as JSON (for scripts)."`
}

// runView is one check as runs shows it.
type runView struct {
	URI        string `json:"uri"`
	Runner     string `json:"runner"`
	Key        string `json:"key"`
	Workflow   string `json:"workflow"`
	Status     string `json:"status"`
	Attempt    int64  `json:"attempt"`
	Kind       string `json:"kind"`
	Repo       string `json:"repo"`
	Ref        string `json:"ref,omitempty"`
	Commit     string `json:"commit,omitempty"`
	Event      string `json:"event"`
	CreatedAt  string `json:"createdAt"`
	StartedAt  string `json:"startedAt,omitempty"`
	FinishedAt string `json:"finishedAt,omitempty"`
	Duration   string `json:"duration,omitempty"`
	FailedStep string `json:"failedStep,omitempty"`
	Error      string `json:"error,omitempty"`
	Cause      string `json:"cause,omitempty"`
}

// Run prints the table (or JSON).
func (c *RunsCmd) Run(ctx context.Context, env *Env) error {
	if c.Limit < 1 {
		return usageError{errors.New("--limit: want 1 or more")}
	}
	f, err := newFinder(ctx, env, &c.ClientFlags, c.Repo)
	if err != nil {
		return err
	}
	all, err := f.all(ctx, env)
	if err != nil {
		return err
	}
	now := time.Now()
	var views []runView
	for _, fc := range all {
		ch := fc.Check
		if c.Status != "" && ch.Status != c.Status {
			continue
		}
		if c.Branch != "" && strings.TrimPrefix(ch.Subject.Ref, "refs/heads/") != strings.TrimPrefix(c.Branch, "refs/heads/") {
			continue
		}
		v := runView{URI: fc.URI.String(), Runner: fc.Runner, Key: fc.Key, Workflow: ch.Workflow, Status: ch.Status,
			Attempt: ch.AttemptNumber(), Kind: ch.Subject.Kind, Repo: ch.Subject.Repo, Ref: ch.Subject.Ref,
			Commit: ch.Subject.Commit, Event: ch.Subject.Event, CreatedAt: ch.CreatedAt, StartedAt: ch.StartedAt,
			FinishedAt: ch.FinishedAt, FailedStep: ch.FailedStep, Error: ch.Error, Cause: ch.Cause}
		if d, ok := checkDuration(ch, now); ok {
			v.Duration = d.String()
		}
		views = append(views, v)
		if len(views) == c.Limit {
			break
		}
	}
	if c.JSON {
		if views == nil {
			views = []runView{}
		}
		b, err := json.MarshalIndent(views, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(env.Stdout, "%s\n", termsafe.JSON(b))
		return err
	}
	if len(views) == 0 {
		fmt.Fprintf(env.Stderr, "knotless-run: no checks in %s\n", f.scope())
		return nil
	}
	colour := useColour(env)
	t := table{head: []string{"STATUS", "WORKFLOW", "SUBJECT", "DURATION", "AGE", "KEY"}, shrink: []int{1, 2}}
	for _, v := range views {
		wf := v.Workflow
		if v.Attempt > 1 {
			wf = fmt.Sprintf("%s #%d", wf, v.Attempt)
		}
		dur := v.Duration
		if dur == "" {
			dur = "-"
		} else if d, err := time.ParseDuration(dur); err == nil {
			dur = shortDuration(d)
		}
		created, _ := time.Parse(time.RFC3339Nano, v.CreatedAt)
		t.rows = append(t.rows, []tcell{
			{text: v.Status, colour: statusColour(v.Status, colour)},
			{text: termsafe.Line(wf)},
			{text: termsafe.Line(subjectText(v))},
			{text: dur},
			{text: age(now, created)},
			{text: v.Key},
		})
	}
	t.print(env.Stdout, terminalWidth(env.Stdout))
	return nil
}

// checkDuration is how long the check ran: to its end, or until now
// while it runs.
func checkDuration(c forge.Check, now time.Time) (time.Duration, bool) {
	start, err := time.Parse(time.RFC3339Nano, c.StartedAt)
	if err != nil {
		return 0, false
	}
	end := now
	if c.FinishedAt != "" {
		if end, err = time.Parse(time.RFC3339Nano, c.FinishedAt); err != nil {
			return 0, false
		}
	} else if c.Final() {
		return 0, false
	}
	return end.Sub(start).Round(time.Millisecond), true
}

// subjectText is a check's subject in a few words: its kind, branch and
// commit.
func subjectText(v runView) string {
	parts := []string{v.Kind}
	if ref := strings.TrimPrefix(v.Ref, "refs/heads/"); ref != "" {
		parts = append(parts, ref)
	}
	if len(v.Commit) >= 7 {
		parts = append(parts, v.Commit[:7])
	}
	return strings.Join(parts, " ")
}

func shortDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}
