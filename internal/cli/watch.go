package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/termsafe"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/rules/control"
)

// WatchCmd follows a run to its end.
type WatchCmd struct {
	ClientFlags `embed:""`
	Repo        string `help:"Where to look for a check named by its key: at://OWNER-DID/dev.knotless.repo/NAME, OWNER-DID/NAME, or NAME, one of yours (default: every repository of the account you logged in as)." placeholder:"REPO" predictor:"repo"`
	ExitStatus  bool   `name:"exit-status" help:"Exit non-zero when the run did not succeed: 1 failure, 2 error, 130 cancelled (as gh run watch --exit-status)."`
	Check       string `arg:"" help:"The check: at://RUNNER/dev.knotless.check/KEY, RUNNER/KEY, or its key or a unique prefix of it, as knotless-run runs shows it." predictor:"check"`
}

// Run follows the check: it waits while it is queued, prints its live
// log while it runs (where its live field says), and its steps as they
// end, then its result.
func (c *WatchCmd) Run(ctx context.Context, env *Env) error {
	f, fc, err := resolveOne(ctx, env, &c.ClientFlags, c.Repo, c.Check)
	if err != nil {
		return err
	}
	final, err := watchCheck(ctx, env, f, fc)
	if err != nil {
		return err
	}
	if c.ExitStatus {
		if code := statusCode(run.Status(final.Status)); code != ExitSuccess {
			return exitError{code: code}
		}
	}
	return nil
}

// watchCheck follows fc to its end and returns its final record.
func watchCheck(ctx context.Context, env *Env, f *finder, fc foundCheck) (forge.Check, error) {
	out := env.Stdout
	if terminal(env.Stdout) {
		filter := termsafe.NewWriter(env.Stdout)
		defer filter.Flush()
		out = filter
	}
	ch := fc.Check
	fmt.Fprintf(env.Stdout, "%s %s (%s) on %s: %s\n", termsafe.Line(ch.Workflow), attemptText(ch),
		termsafe.Line(subjectOf(ch)), fc.Runner, fc.Key)
	colour := useColour(env)
	shown := 0
	said := ""
	followed := false
	for {
		if ch.Status != said {
			if !ch.Final() {
				fmt.Fprintf(env.Stdout, "%s\n", paint(ch.Status, colour))
			}
			said = ch.Status
		}
		if !followed && ch.Live != nil && ch.Live.Service != "" && !ch.Final() {
			followed = true
			if _, err := followLogs(ctx, &outputhttp.Client{Base: ch.Live.Service}, fc.URI.String(), out, env.Logger); err != nil {
				var ee exitError
				if errors.As(err, &ee) {
					return ch, err
				}
				env.Logger.Warn("the live output cannot be followed; watching the check record", "err", err)
			}
			if fl, ok := out.(interface{ Flush() error }); ok {
				_ = fl.Flush()
			}
		}
		if shown < len(ch.Steps) && !followed {
			shown = printSteps(env.Stdout, ch.Steps, shown, colour)
		}
		if ch.Final() {
			break
		}
		select {
		case <-ctx.Done():
			return ch, exitError{code: ExitCancelled}
		case <-time.After(pollEvery):
		}
		next, err := f.get(ctx, fc.URI)
		if err != nil {
			return ch, err
		}
		ch = next.Check
	}
	if !followed && ch.Log != nil {
		// No live output was followed (the run ended before the watch
		// began, or its runner serves none): its log is the check's.
		if did, err := fc.URI.Authority().AsDID(); err != nil {
			env.Logger.Warn("the run's log cannot be read", "err", err)
		} else if log, err := f.r.GetBlob(ctx, did, ch.Log.Ref.String()); err != nil {
			env.Logger.Warn("the run's log cannot be read", "err", err)
		} else {
			_, _ = out.Write(log)
			if fl, ok := out.(interface{ Flush() error }); ok {
				_ = fl.Flush()
			}
		}
	}
	if followed {
		shown = 0
	}
	printSteps(env.Stdout, ch.Steps, shown, colour)
	line := fmt.Sprintf("%s %s", paint(ch.Status, colour), termsafe.Line(ch.Workflow))
	if d, ok := checkDuration(ch, time.Now()); ok {
		line += " in " + shortDuration(d)
	}
	if ch.FailedStep != "" {
		line += ": step " + termsafe.Line(ch.FailedStep)
	}
	if ch.Error != "" {
		line += ": " + termsafe.Line(ch.Error)
	}
	fmt.Fprintln(env.Stdout, line)
	return ch, nil
}

// printSteps prints steps[from:] that have ended, one a line, and
// returns how many are printed.
func printSteps(w io.Writer, steps []forge.CheckStep, from int, colour bool) int {
	for _, s := range steps[from:] {
		if !slices.Contains([]run.Status{run.Success, run.Failure, run.Error, run.Cancelled, run.Skipped}, run.Status(s.Status)) {
			break // not ended yet
		}
		text := fmt.Sprintf("  %s %s %s", paint(s.Status, colour), termsafe.Line(s.Name), shortDuration(time.Duration(s.DurationMs)*time.Millisecond))
		if s.ExitCode != nil && *s.ExitCode != 0 {
			text += fmt.Sprintf(" (exit %d)", *s.ExitCode)
		}
		if s.TimedOut {
			text += " (timed out)"
		}
		fmt.Fprintln(w, text)
		from++
	}
	return from
}

func paint(status string, colour bool) string {
	if c := statusColour(status, colour); c != "" {
		return "\x1b[" + c + "m" + status + "\x1b[0m"
	}
	return status
}

func attemptText(c forge.Check) string {
	if c.AttemptNumber() > 1 {
		return fmt.Sprintf("attempt %d", c.AttemptNumber())
	}
	return "attempt 1"
}

func subjectOf(c forge.Check) string {
	return subjectText(runView{Kind: c.Subject.Kind, Ref: c.Subject.Ref, Commit: c.Subject.Commit})
}

// WaitFlags bound how long a command that writes a record waits for the
// runner to act on it.
type WaitFlags struct {
	Wait   time.Duration `help:"How long to wait for the runner to act on the record. (default ${default})" default:"2m" placeholder:"DURATION"`
	NoWait bool          `name:"no-wait" help:"Write the record and return, without waiting for the runner."`
}

// errNotActed is a wait that ran out.
func (w *WaitFlags) errNotActed(uri syntax.ATURI) error {
	return fmt.Errorf("no runner has acted on %s within --wait %s: the record is written and will act when the runner reads it (is the runner up, and does it read your records? knotless-run runs shows the checks)", uri, w.Wait)
}

// poll calls done every pollEvery until it says true, fails, or the
// wait ends.
func (w *WaitFlags) poll(ctx context.Context, uri syntax.ATURI, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, w.Wait)
	defer cancel()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return w.errNotActed(uri)
			}
			return exitError{code: ExitCancelled}
		case <-time.After(pollEvery):
		}
	}
}

// waitCancelled waits until every check of t is final and says how
// each ended.
func waitCancelled(ctx context.Context, env *Env, w *WaitFlags, f *finder, t target, uri syntax.ATURI) error {
	pending := slices.Clone(t.found)
	return w.poll(ctx, uri, func() (bool, error) {
		var left []foundCheck
		for _, fc := range pending {
			next, err := f.get(ctx, fc.URI)
			if err != nil {
				return false, err
			}
			if !next.Check.Final() {
				left = append(left, next)
				continue
			}
			if next.Check.Status == "cancelled" {
				fmt.Fprintf(env.Stdout, "Cancelled %s (%s) on %s: %s\n", termsafe.Line(next.Check.Workflow), next.Key, next.Runner, termsafe.Line(next.Check.Error))
			} else {
				fmt.Fprintf(env.Stdout, "%s (%s) on %s ended %s before the cancel was read\n", termsafe.Line(next.Check.Workflow), next.Key, next.Runner, termsafe.Line(next.Check.Status))
			}
		}
		pending = left
		return len(pending) == 0, nil
	})
}

// waitRerun waits until each runner of t has made the new attempts the
// re-run record uri asks of it (control.PlanRerun, the runner's rule,
// over its checks) and prints them.
func waitRerun(ctx context.Context, env *Env, w *WaitFlags, f *finder, t target, uri syntax.ATURI, rec forge.Rerun) error {
	done := map[string]bool{}
	said := map[string]bool{}
	return w.poll(ctx, uri, func() (bool, error) {
		all := true
		for _, named := range t.found {
			if done[named.Runner] {
				continue
			}
			did, _ := syntax.ParseDID(named.Runner)
			recs, _, err := pdsclient.List[forge.Check](ctx, f.r, did, forge.CollectionCheck)
			if err != nil {
				return false, err
			}
			var checks []forge.Check
			var caused []forge.Record[forge.Check]
			for _, r := range recs {
				checks = append(checks, r.Value)
				if r.Value.Cause == uri.String() {
					caused = append(caused, r)
				}
			}
			plan := control.PlanRerun(named.Runner, uri.String(), rec, &named.Check, checks)
			switch plan.Verdict {
			case control.Refuse, control.NotMine:
				return false, plan.Err
			case control.Done:
				done[named.Runner] = true
				if len(caused) == 0 {
					fmt.Fprintf(env.Stdout, "Nothing to re-run on %s: no workflow of the event is selected (with --failed: none failed)\n", named.Runner)
				}
				for _, c := range caused {
					fmt.Fprintf(env.Stdout, "Re-running %s (attempt %d) on %s: %s\n", termsafe.Line(c.Value.Workflow), c.Value.AttemptNumber(), named.Runner, c.URI.RecordKey())
				}
				continue
			case control.Wait:
				if !said[named.Runner] {
					fmt.Fprintf(env.Stderr, "knotless-run: waiting for the last attempt of %s to end on %s\n", strings.Join(plan.Waiting, ", "), named.Runner)
					said[named.Runner] = true
				}
			}
			all = false
		}
		return all, nil
	})
}

// waitDispatch waits until a runner of the repository writes the check
// of the dispatch record uri, and prints it; an error check (a bad
// input, a workflow that does not run on dispatch) is the command's
// error.
func waitDispatch(ctx context.Context, env *Env, w *WaitFlags, r *pdsclient.Reader, runners []string, uri syntax.ATURI, rec forge.Dispatch) error {
	key := forge.CheckKey(control.DispatchSubject(uri.String(), rec, ""), rec.Workflow)
	var got *foundCheck
	f := &finder{r: r}
	err := w.poll(ctx, uri, func() (bool, error) {
		for _, d := range runners {
			fc, err := f.get(ctx, syntax.ATURI("at://"+d+"/"+forge.CollectionCheck+"/"+key))
			if errors.Is(err, pdsclient.ErrNotFound) {
				continue
			}
			if err != nil {
				return false, err
			}
			got = &fc
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "Dispatched %s on %s: %s (%s)\n", termsafe.Line(rec.Workflow), got.Runner, got.Key, termsafe.Line(got.Check.Status))
	if got.Check.Status == "error" {
		return fmt.Errorf("the runner refused the dispatch: %s", termsafe.Line(got.Check.Error))
	}
	return nil
}
