package daemon_test

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/internal/rules/control"
	"knotless.dev/run/tests/pds"
)

// Run control through serve on the real PDS: the owner (and a pull's
// author) write cancel, rerun and dispatch records in their own repo;
// a second account, the stranger, writes the same and is refused.

// controlled is the daemon's configuration for run control: the event
// stream on (a stranger's records are listed once it shows them
// writing), pulls on.
func controlled(c *daemon.Config) {
	c.Intake.Firehose = true
	c.Sources.Pulls = true
}

// checkOf waits for a check of workflow on commit written with status
// and returns its key.
func (w *world) checkOf(workflow, commit, status string, timeout time.Duration) string {
	w.t.Helper()
	w.waitStatus(workflow, commit, status, timeout)
	w.checkLog.mu.Lock()
	defer w.checkLog.mu.Unlock()
	for _, cw := range w.checkLog.writes {
		if cw.check.Workflow == workflow && cw.check.Subject.Commit == commit && cw.check.Status == status {
			return cw.key
		}
	}
	w.t.Fatalf("no %s check of %s", status, workflow)
	return ""
}

// check is the runner's check record of key on the PDS.
func (w *world) check(key string) forge.Check {
	w.t.Helper()
	var c forge.Check
	if _, err := w.Reader.Get(context.Background(), syntax.ATURI("at://"+w.Runner.DID.String()+"/"+forge.CollectionCheck+"/"+key), &c); err != nil {
		w.t.Fatal(err)
	}
	return c
}

// waitKey waits for the check of key to be final on the PDS.
func (w *world) waitKey(key string, timeout time.Duration) forge.Check {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, r := range w.Checks() {
			if r.URI.RecordKey().String() == key && r.Value.Final() {
				return r.Value
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no final check %s after %s\nlog:\n%s", key, timeout, w.logText())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitLog waits for the daemon's log to hold s.
func (w *world) waitLog(s string, timeout time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(w.logText(), s) {
		if time.Now().After(deadline) {
			w.t.Fatalf("the log has no %q after %s:\n%s", s, timeout, w.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cancel writes actor's cancel record of the check of key (as
// knotless-run cancel prints it) and returns its AT-URI.
func (w *world) cancel(actor *pds.Account, key string) syntax.ATURI {
	w.t.Helper()
	rec := forge.Cancel{Type: forge.CollectionCancel, Check: key, Runner: w.Runner.DID.String(), Repo: w.RepoURI.String(), CreatedAt: forge.Now()}
	return w.Put(actor, forge.CollectionCancel, forge.CancelKey(rec.Runner, key), rec)
}

// rerun writes actor's rerun record.
func (w *world) rerun(actor *pds.Account, key string, rec forge.Rerun) syntax.ATURI {
	w.t.Helper()
	rec.Type, rec.Check, rec.Runner, rec.Repo, rec.CreatedAt = forge.CollectionRerun, key, w.Runner.DID.String(), w.RepoURI.String(), forge.Now()
	return w.Put(actor, forge.CollectionRerun, "", rec)
}

// stoppedIn is the cancel's figure the daemon logged: from the record
// read to the run stopped.
var stoppedIn = regexp.MustCompile(`run stopped by a cancel record.* stopped_in=(\S+)`)

// TestServeCancel: the owner's cancel stops a running check (it ends
// cancelled naming the record, within the figure logged) and drops a
// queued one (which never runs); a stranger's cancel of the same check
// is refused and changes nothing.
func TestServeCancel(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	started := filepath.Join(t.TempDir(), "started")
	_, commit := w.Push(map[string]string{
		// Claimed in name order, one at a time: first runs, second waits.
		".knotless/workflows/first.yaml": workflowFile(`
on: [push]
steps:
  - name: slow
    run: touch ` + started + `; sleep 300
`),
		".knotless/workflows/second.yaml": workflowFile(`
on: [push]
steps:
  - name: later
    run: echo later ran
`),
	})
	w.start(w.config(controlled))
	w.waitFile(started, time.Minute)
	slow := w.checkOf("first", commit, "running", time.Minute)
	later := w.checkOf("second", commit, "queued", time.Minute) // concurrency 1: it waits

	stranger, err := srv.CreateAccount(context.Background(), "stranger")
	if err != nil {
		t.Fatal(err)
	}
	w.waitLog("following events", time.Minute) // the stream shows the stranger
	refused := w.cancel(stranger, slow)
	w.waitLog("run-control record refused", time.Minute)
	if !strings.Contains(w.logText(), refused.String()) {
		t.Errorf("the refusal does not name the stranger's record %s", refused)
	}
	if c := w.check(slow); c.Status != "running" {
		t.Fatalf("after a stranger's cancel the check is %s (%s)", c.Status, c.Error)
	}

	byOwner := w.cancel(w.Owner, later)
	_, c := w.waitFinal("second", commit, time.Minute)
	if c.Status != "cancelled" || c.CancelledBy != byOwner.String() || c.Error != control.CancelledText(byOwner.String()) {
		t.Errorf("the queued check: %s by %q (%q)", c.Status, c.CancelledBy, c.Error)
	}
	byOwner = w.cancel(w.Owner, slow)
	_, c = w.waitFinal("first", commit, time.Minute)
	if c.Status != "cancelled" || c.CancelledBy != byOwner.String() {
		t.Errorf("the running check: %s by %q (%q)", c.Status, c.CancelledBy, c.Error)
	}
	if got := w.checkLog.statuses("second", commit); strings.Join(got, " ") != "queued cancelled" {
		t.Errorf("the queued check's writes: %v (it must not run)", got)
	}
	if m := stoppedIn.FindStringSubmatch(w.logText()); m != nil {
		t.Logf("cancel: the run stopped in %s after the record was read (shell executor)", m[1])
	} else {
		t.Error("no figure of the cancel logged")
	}
	if strings.Contains(w.logText(), "later ran") {
		t.Error("the cancelled queued check ran")
	}
}

// TestServeRerun: the owner re-runs the failed workflows of a push with
// a run variable: a new attempt, its own check with the record as its
// cause, trusted (it gets the push's secret), the variable in every
// step; the original check keeps its result. A second reading of the
// record runs nothing more.
func TestServeRerun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	_, commit := w.Push(map[string]string{
		".knotless/workflows/pass.yaml": workflowFile(`
on: [push]
steps:
  - name: pass
    run: echo pass
`),
		".knotless/workflows/flaky.yaml": workflowFile(`
on: [push]
secrets: [TOKEN]
steps:
  - name: flaky
    secrets: [TOKEN]
    run: |
      echo "debug=${DEBUG:-unset} token=${TOKEN:+given}"
      test "$DEBUG" = 1
`),
	})
	w.start(w.config(controlled, func(c *daemon.Config) {
		c.Scheduler.Secrets = []scheduler.OperatorSecret{{Name: "TOKEN", Value: "s3cr3t-value", Repos: []string{w.RepoURI.String()}}}
	}))
	first, failed := w.waitFinal("flaky", commit, time.Minute)
	if failed.Status != "failure" {
		t.Fatalf("flaky's first run: %s", failed.Status)
	}
	w.waitFinal("pass", commit, time.Minute)
	rr := w.rerun(w.Owner, first, forge.Rerun{Failed: true, Env: []forge.Variable{{Name: "DEBUG", Value: "1"}}})
	key := forge.AttemptKey(failed.Subject, "flaky", 2)
	c := w.waitKey(key, time.Minute)
	if c.Status != "success" || c.Attempt != 2 || c.Cause != rr.String() || c.Subject != failed.Subject {
		t.Errorf("attempt 2: %+v", c)
	}
	if log := w.runLog(c); !strings.Contains(log, "debug=1 token=given") {
		t.Errorf("attempt 2's log lacks the variable or the secret:\n%s", log)
	}
	if c := w.check(first); c.Status != "failure" {
		t.Errorf("the first attempt became %s", c.Status)
	}
	if got := w.checkLog.statuses("pass", commit); strings.Join(got, " ") != "queued running success" {
		t.Errorf("pass was run again: %v", got)
	}
	// Read at every reconcile: served once.
	time.Sleep(time.Second) // a few reconciles (every 300 ms)
	if got := w.checkLog.statuses("flaky", commit); strings.Join(got, " ") != "running failure running success" {
		t.Errorf("flaky's writes: %v", got)
	}
	// Variables that may not be: an error check naming the variable,
	// its step skipped.
	for i, bad := range []forge.Variable{{Name: "TOKEN", Value: "stolen?"}, {Name: "KNOTLESS_RUN_WORK", Value: "/"}, {Name: "1x", Value: "y"}} {
		w.rerun(w.Owner, first, forge.Rerun{Workflow: "flaky", Env: []forge.Variable{bad}})
		c := w.waitKey(forge.AttemptKey(failed.Subject, "flaky", int64(3+i)), time.Minute)
		if c.Status != "error" || !strings.Contains(c.Error, `run variable "`+bad.Name+`"`) || len(c.Steps) != 1 || c.Steps[0].Status != "skipped" {
			t.Errorf("a re-run with %s: %s %q, steps %v", bad.Name, c.Status, c.Error, c.Steps)
		}
	}
}

// TestServePullRerunAndCancel: a pull's author re-runs its pull's check:
// the attempt is untrusted (no secret) and runs the pull merged onto
// its base; a stranger's re-run of it and the author's cancel of the
// owner's push are refused.
func TestServePullRerunAndCancel(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	_, base := w.Push(map[string]string{".knotless/workflows/ci.yaml": workflowFile(`
on: [push, pull]
secrets: [TOKEN]
steps:
  - name: ci
    secrets: [TOKEN]
    run: echo "again=${AGAIN:-no} token=${TOKEN:+given}"
`)})
	author, err := srv.CreateAccount(ctx, "author")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := srv.CreateAccount(ctx, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	head := fork.Commit("feature", map[string]string{"feature.txt": "new\n"})
	w.start(w.config(controlled, func(c *daemon.Config) {
		c.Sources.Discover = true // the author's pull is found by listing the PDS's accounts
		c.Scheduler.Secrets = []scheduler.OperatorSecret{{Name: "TOKEN", Value: "s3cr3t-value", Repos: []string{w.RepoURI.String()}}}
	}))
	pushKey, push := w.waitFinal("ci", base, time.Minute)
	if push.Status != "success" || !strings.Contains(w.runLog(push), "token=given") {
		t.Fatalf("the owner's push: %s %s", push.Status, w.runLog(push))
	}
	w.openPull(author, fork.Dir, "feature", head)
	pullKey, pull := w.waitFinal("ci", head, time.Minute)
	if pull.Status != "success" {
		t.Fatalf("the pull: %s", pull.Status)
	}
	w.waitLog("following events", time.Minute)
	strangers := w.rerun(stranger, pullKey, forge.Rerun{})
	denied := w.cancel(author, pushKey)
	for _, uri := range []syntax.ATURI{strangers, denied} {
		w.waitLog(uri.String(), time.Minute)
	}
	rr := w.rerun(author, pullKey, forge.Rerun{Env: []forge.Variable{{Name: "AGAIN", Value: "yes"}}})
	c := w.waitKey(forge.AttemptKey(pull.Subject, "ci", 2), time.Minute)
	if c.Status != "success" || c.Cause != rr.String() || c.Subject.Kind != forge.KindPull {
		t.Errorf("the author's re-run: %+v", c)
	}
	if log := w.runLog(c); !strings.Contains(log, "again=yes token=") {
		t.Errorf("the re-run of a pull is not untrusted, or lacks its variable:\n%s", log)
	}
	if c := w.check(pushKey); c.Status != "success" || c.CancelledBy != "" {
		t.Errorf("the author's cancel changed the owner's push: %+v", c)
	}
	if n := strings.Count(w.logText(), "run-control record refused"); n < 2 {
		t.Errorf("%d refusals logged, want the stranger's re-run and the author's cancel", n)
	}
	if got := w.checkLog.statuses("ci", head); strings.Join(got, " ") != "running success running success" {
		t.Errorf("the pull's writes: %v (a stranger's re-run ran?)", got)
	}
}

// TestServeDispatch: the owner's dispatch runs an on: dispatch workflow
// on the branch's head, trusted, its inputs (with defaults) in every
// step; a bad input and a branch the source lacks are error checks
// naming them; a stranger's dispatch writes nothing (dispatches are
// read from owners only).
func TestServeDispatch(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	_, commit := w.Push(map[string]string{".knotless/workflows/deploy.yaml": workflowFile(`
on:
  dispatch:
    inputs:
      target: {type: choice, options: [staging, production], default: staging}
      dry_run: {type: boolean, required: true}
steps:
  - name: deploy
    run: echo "deploying to $target dry=$dry_run"
`)})
	stranger, err := srv.CreateAccount(ctx, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	w.start(w.config(controlled))
	dispatch := func(a *pds.Account, inputs ...forge.Variable) syntax.ATURI {
		return w.Put(a, forge.CollectionDispatch, "", forge.Dispatch{Type: forge.CollectionDispatch, Repo: w.RepoURI.String(),
			Ref: "refs/heads/main", Workflow: "deploy", Inputs: inputs, CreatedAt: forge.Now()})
	}
	strangers := dispatch(stranger, forge.Variable{Name: "dry_run", Value: "false"})
	good := dispatch(w.Owner, forge.Variable{Name: "dry_run", Value: "true"})
	bad := dispatch(w.Owner, forge.Variable{Name: "target", Value: "moon"}, forge.Variable{Name: "dry_run", Value: "true"})
	gone := w.Put(w.Owner, forge.CollectionDispatch, "", forge.Dispatch{Type: forge.CollectionDispatch, Repo: w.RepoURI.String(),
		Ref: "refs/heads/gone", Workflow: "deploy", Inputs: []forge.Variable{{Name: "dry_run", Value: "true"}}, CreatedAt: forge.Now()})
	keyOf := func(uri syntax.ATURI) string {
		return forge.CheckKey(forge.Subject{Kind: forge.KindDispatch, Event: uri.String()}, "deploy")
	}
	deadline := time.Now().Add(time.Minute)
	for {
		recs := map[string]forge.Check{}
		for _, r := range w.Checks() {
			recs[r.URI.RecordKey().String()] = r.Value
		}
		g, gok := recs[keyOf(good)]
		b, bok := recs[keyOf(bad)]
		n, nok := recs[keyOf(gone)]
		if gok && bok && nok && g.Final() && b.Final() && n.Final() {
			if g.Status != "success" || g.Cause != good.String() || g.Subject.Commit != commit || g.Subject.Kind != forge.KindDispatch {
				t.Errorf("the dispatch: %+v", g)
			}
			if log := w.runLog(g); !strings.Contains(log, "deploying to staging dry=true") {
				t.Errorf("the dispatch's log lacks its inputs:\n%s", log)
			}
			if b.Status != "error" || !strings.Contains(b.Error, `input "target"`) {
				t.Errorf("the bad dispatch: %s %q", b.Status, b.Error)
			}
			if n.Status != "error" || !strings.Contains(n.Error, `branch "gone"`) || n.Cause != gone.String() {
				t.Errorf("the dispatch to a missing branch: %s %q", n.Status, n.Error)
			}
			if _, ok := recs[keyOf(strangers)]; ok {
				t.Error("the stranger's dispatch wrote a check")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dispatches not final: %+v\n%s", recs, w.logText())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestServeSchedule: a workflow on: schedule every minute runs on the
// default branch's head at a tick, the tick in its subject and key; a
// restarted runner does not run that tick again, and runs the next one
// once.
func TestServeSchedule(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/nightly.yaml": workflowFile(`
on:
  schedule:
    - cron: "* * * * *"
steps:
  - name: tick
    run: echo tick
`)})
	ticks := func() map[string]string {
		out := map[string]string{}
		for _, r := range w.Checks() {
			if r.Value.Subject.Kind == forge.KindSchedule {
				out[r.Value.Subject.Tick] = r.Value.Status
			}
		}
		return out
	}
	waitTicks := func(n int) map[string]string {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			got := ticks()
			final := 0
			for _, s := range got {
				if s == "success" {
					final++
				}
			}
			if final >= n {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d ticks final, want %d: %v\n%s", final, n, got, w.logText())
			}
			time.Sleep(time.Second)
		}
	}
	stop := w.start(w.config())
	first := waitTicks(1)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for tick := range first {
		if _, err := time.Parse(time.RFC3339, tick); err != nil {
			t.Errorf("tick %q: %v", tick, err)
		}
	}
	w.start(w.config())
	got := waitTicks(len(first) + 1)
	for _, r := range w.Checks() {
		if c := r.Value; c.Subject.Kind == forge.KindSchedule {
			if c.Subject.Commit != commit || c.Subject.Ref != "refs/heads/main" || c.Subject.Event != w.RepoURI.String() {
				t.Errorf("a tick's subject: %+v", c.Subject)
			}
			if want := forge.CheckKey(c.Subject, "nightly"); r.URI.RecordKey().String() != want {
				t.Errorf("a tick's key %s, want %s", r.URI.RecordKey(), want)
			}
		}
	}
	if n := strings.Count(w.logText(), "schedule: tick due"); n != len(got) {
		t.Errorf("%d ticks run for %d checks (a tick run twice?): %v", n, len(got), got)
	}
}

// TestServeScheduleFlood: thirty workflows that tick every minute are
// one event a minute, over --max-workflows-per-event (20): each tick
// writes one error check naming the flag, and runs nothing. (Each tick
// its own event, counted against no one, they queued thirty runs and
// ninety check writes a minute.)
func TestServeScheduleFlood(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	files := map[string]string{}
	for i := range 30 {
		files[fmt.Sprintf(".knotless/workflows/tick%02d.yaml", i)] = workflowFile(`
on:
  schedule:
    - cron: "* * * * *"
steps:
  - name: tick
    run: echo tick
`)
	}
	w.Push(files)
	scheduled := func() []forge.Check {
		var out []forge.Check
		for _, r := range w.Checks() {
			if r.Value.Subject.Kind == forge.KindSchedule {
				out = append(out, r.Value)
			}
		}
		return out
	}
	stop := w.start(w.config())
	defer stop()
	deadline := time.Now().Add(3 * time.Minute)
	for len(scheduled()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no tick in 3 minutes:\n%s", w.logText())
		}
		time.Sleep(time.Second)
	}
	time.Sleep(3 * time.Second) // what else the tick would write
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := scheduled()
	ticks := map[string]bool{}
	for _, c := range got {
		ticks[c.Subject.Tick] = true
		if c.Workflow != intake.RefusedCheck || c.Status != "error" || !strings.Contains(c.Error, "30 workflows match this event, more than --max-workflows-per-event allows (20)") {
			t.Errorf("a tick's check: %s %s %q, want the one refusal", c.Workflow, c.Status, c.Error)
		}
	}
	if len(got) != len(ticks) {
		t.Errorf("%d checks for %d ticks, want one each", len(got), len(ticks))
	}
	if strings.Contains(w.logText(), "msg=queued") {
		t.Errorf("a tick queued a run:\n%s", w.logText())
	}
}
