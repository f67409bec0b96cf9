package runctl

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/control"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// Schedules as floods: a repository's ticks of one minute are one
// event, its runs and check writes count against the owner, a slow
// workflow holds one tick queued; and what is kept of schedules
// follows what is scheduled and served.

// scheduled is a workflow that runs on cron spec.
func scheduled(name, spec string) *workflow.Workflow {
	wf := rig.CI(name, "make")
	wf.On = []workflow.Trigger{workflow.Schedule}
	wf.Schedule = []workflow.Cron{{Spec: spec}}
	return wf
}

// tickKey is the check key of workflow wf's tick at t on the rig's
// repository.
func tickKey(wf string, t time.Time) string {
	return forge.CheckKey(control.ScheduleSubject(rig.Repo, "refs/heads/main", rig.BaseCommit("main"), t), wf)
}

// sleepTo sleeps until the next time of the hour at minute m and
// second s (in a synctest bubble: at once).
func sleepTo(m, s int) {
	now := time.Now()
	at := now.Truncate(time.Hour).Add(time.Duration(m)*time.Minute + time.Duration(s)*time.Second)
	if !at.After(now) {
		at = at.Add(time.Hour)
	}
	time.Sleep(time.Until(at))
}

// ownerLoad is what the repository's owner has in hand, as the caps
// count it.
func (w *world) ownerLoad() (runs, owing int) {
	return w.sched.Load(rig.Owner, work.Event{Kind: forge.KindSchedule, Repo: rig.RepoRecord()})
}

// A hundred workflows of one repository that tick every minute are one
// event a minute, over --max-workflows-per-event: each minute one error
// check naming the flag, and no run. (Each tick its own event, they
// queued a hundred runs and three hundred check writes a minute.)
func TestScheduleFloodIsOneEvent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		obs := &observed{}
		w.observer = obs
		w.join()
		var wfs []*workflow.Workflow
		for i := range 100 {
			wfs = append(wfs, scheduled(fmt.Sprintf("wf%03d", i), "* * * * *"))
		}
		w.git.SetWorkflows(wfs...)
		w.lister.SetRepos(rig.RepoRecord())
		sleepTo(0, 30)
		w.reconcile(t) // first sight
		for range 3 {
			time.Sleep(time.Minute)
			w.reconcile(t)
		}
		writes := w.pds.Writes()
		if len(writes) != 3 {
			t.Fatalf("%d check writes in three minutes, want 3 (one refusal a minute): %v", len(writes), writes[:min(len(writes), 5)])
		}
		for i := range 3 {
			tick := time.Now().Truncate(time.Minute).Add(time.Duration(i-2) * time.Minute)
			key := tickKey(intake.RefusedCheck, tick)
			c, _ := w.keeper.Get(key)
			if c.Status != "error" || !strings.Contains(c.Error, "100 workflows match this event, more than --max-workflows-per-event allows (20)") {
				t.Errorf("the refusal of the tick %s: %s %q", tick, c.Status, c.Error)
			}
		}
		if runs, _ := w.ownerLoad(); runs != 0 {
			t.Errorf("the owner has %d runs in hand, want none", runs)
		}
		if got := strings.Count(strings.Join(obs.get(), "\n"), "refused --max-workflows-per-event"); got != 3 {
			t.Errorf("refusals observed: %v", obs.get())
		}
		// Each tick is recorded as run: the refused minute is not due
		// again.
		if got := w.store.ScheduleLast(rig.Repo, "wf042"); !got.Equal(time.Now().Truncate(time.Minute)) {
			t.Errorf("wf042's last tick %s, want this minute's", got)
		}
	})
}

// A hundred workflows of one owner, twenty of them ticking at each of
// five minutes, stay within the owner's caps: twenty runs queued at
// most (--max-queued-per-author), their writes counted against the
// owner's budget; the ticks over the cap wait without a check and are
// not recorded as run, and the newest one due runs once the owner's
// runs end. (Counted against no one, they queued all hundred.)
func TestScheduleTicksCountAgainstTheOwner(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		var wfs []*workflow.Workflow
		for i := range 100 {
			wfs = append(wfs, scheduled(fmt.Sprintf("wf%03d", i), fmt.Sprintf("%d * * * *", i%5)))
		}
		w.git.SetWorkflows(wfs...)
		w.lister.SetRepos(rig.RepoRecord())
		sleepTo(59, 30)
		w.reconcile(t) // first sight
		var first []string
		for m := range 5 {
			sleepTo(m, 30)
			w.reconcile(t)
			if m == 0 {
				first = w.pds.Writes()
			}
		}
		if runs, owing := w.ownerLoad(); runs != 20 || owing != 40 {
			t.Errorf("the owner has %d runs in hand owing %d writes, want 20 owing 40 (--max-queued-per-author)", runs, owing)
		}
		if n := len(w.pds.Writes()); n != 20 || len(first) != 20 {
			t.Errorf("%d check writes (%d at the first minute), want the 20 queued checks of the first minute", n, len(first))
		}
		hour := time.Now().Truncate(time.Hour)
		if got := w.store.ScheduleLast(rig.Repo, "wf001"); !got.Before(hour.Add(time.Minute)) {
			t.Errorf("wf001's tick at minute 1 waited for the owner's caps but is recorded as run (%s)", got)
		}
		// The owner's runs end: the ticks waiting run, the newest one
		// due of each workflow (minute 1 first: one event at a time
		// within the cap).
		for i := range 20 {
			w.drop(t, tickKey(fmt.Sprintf("wf%03d", 5*i), hour))
		}
		w.reconcile(t)
		for i := range 100 {
			name := fmt.Sprintf("wf%03d", i)
			c, _ := w.keeper.Get(tickKey(name, hour.Add(time.Duration(i%5)*time.Minute)))
			if queued, want := c.Status == "queued", i%5 == 1; queued != want {
				t.Errorf("%s's tick at minute %d queued: %v, want %v", name, i%5, queued, want)
			}
		}
		if runs, _ := w.ownerLoad(); runs != 20 {
			t.Errorf("after the owner's runs ended: %d runs in hand, want 20", runs)
		}
	})
}

// A tick of a workflow whose previous tick is still queued is skipped:
// logged naming both, counted, recorded as run (not due again); once
// the previous one has left the queue, the next tick is queued.
func TestScheduleSkipsATickWhileThePreviousIsQueued(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		obs := &observed{}
		log := &syncbuf.Buffer{}
		w.observer, w.log = obs, slog.New(slog.NewTextHandler(log, nil))
		w.join()
		w.git.SetWorkflows(scheduled("slow", "* * * * *"))
		w.lister.SetRepos(rig.RepoRecord())
		sleepTo(0, 30)
		w.reconcile(t) // first sight
		time.Sleep(time.Minute)
		w.reconcile(t)
		first := time.Now().Truncate(time.Minute)
		if c, _ := w.keeper.Get(tickKey("slow", first)); c.Status != "queued" {
			t.Fatalf("the first tick: %q, want queued", c.Status)
		}
		time.Sleep(time.Minute)
		w.reconcile(t)
		second := time.Now().Truncate(time.Minute)
		if _, known := w.keeper.Get(tickKey("slow", second)); known {
			t.Error("the second tick was queued while the first is still queued")
		}
		if got := obs.get(); len(got) == 0 || got[len(got)-1] != "tick skipped queued" {
			t.Errorf("observed %v, want a tick skipped", got)
		}
		for _, want := range []string{"previous tick is still queued", "workflow=slow", "tick=" + control.TickID(second),
			"queued_tick=" + control.TickID(first), "queued_check=" + tickKey("slow", first), "repo=" + rig.Repo} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("the log does not say %q:\n%s", want, log)
			}
		}
		if got := w.store.ScheduleLast(rig.Repo, "slow"); !got.Equal(second) {
			t.Errorf("last tick %s, want the skipped one, %s", got, second)
		}
		// The first leaves the queue (it started, or ended): the next
		// tick is queued.
		w.drop(t, tickKey("slow", first))
		time.Sleep(time.Minute)
		w.reconcile(t)
		if c, _ := w.keeper.Get(tickKey("slow", time.Now().Truncate(time.Minute))); c.Status != "queued" {
			t.Errorf("the third tick: %q, want queued", c.Status)
		}
	})
}

// completeLister is the rig's lister saying whether its listing failed
// nowhere (ingest.Snapshot.Complete).
type completeLister struct {
	*rig.Lister
	complete bool
}

func (l *completeLister) Reconcile(ctx context.Context) (*ingest.Snapshot, error) {
	snap, err := l.Lister.Reconcile(ctx)
	if snap != nil {
		snap.Complete = l.complete
	}
	return snap, err
}

// What is kept of a workflow no longer scheduled at its repository's
// head is forgotten at the next read; what is kept of a repository no
// longer served is forgotten after a listing that failed nowhere, and
// kept after one that failed in part.
func TestSchedulesForgotten(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		lister := &completeLister{Lister: w.lister}
		w.listing = lister
		w.join()
		w.git.SetWorkflows(scheduled("a", "* * * * *"), scheduled("b", "0 0 * * *"))
		w.lister.SetRepos(rig.RepoRecord())
		sleepTo(0, 30)
		w.reconcile(t)
		if got := len(w.store.Snapshot().Schedules[rig.Repo]); got != 2 {
			t.Fatalf("%d schedules kept at first sight, want 2", got)
		}
		w.git.SetWorkflows(scheduled("a", "* * * * *"), rig.CI("b", "make"))
		time.Sleep(time.Minute) // a's tick: the head read again
		w.reconcile(t)
		if got := w.store.Snapshot().Schedules[rig.Repo]; len(got) != 1 || got["a"].IsZero() {
			t.Errorf("schedules kept %v, want a's only: b is no longer scheduled", got)
		}
		// No longer served, by a listing that failed in part: kept.
		w.lister.SetRepos()
		w.reconcile(t)
		if got := w.store.Snapshot().Schedules; len(got) != 1 {
			t.Errorf("schedules %v forgotten after a listing that failed in part", got)
		}
		lister.complete = true
		w.reconcile(t)
		if got := w.store.Snapshot().Schedules; len(got) != 0 {
			t.Errorf("schedules %v kept of a repository no longer served", got)
		}
		w.rc.mu.Lock()
		defer w.rc.mu.Unlock()
		if len(w.rc.schedules) != 0 || len(w.rc.queuedTicks) != 0 {
			t.Errorf("in memory: schedules %v, queued ticks %v", w.rc.schedules, w.rc.queuedTicks)
		}
	})
}

// A matrix workflow's tick is its legs, each a check: while a leg of
// the previous tick is queued, the next tick is skipped.
func TestScheduleSkipsATickWhileALegOfThePreviousIsQueued(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		w.join()
		wf, err := workflow.Parse(".knotless/workflows/slow.yaml", []byte("on:\n  schedule:\n    - cron: '* * * * *'\nmatrix:\n  a: [x, y]\nsteps: [{run: make}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		w.git.SetWorkflows(wf)
		w.lister.SetRepos(rig.RepoRecord())
		sleepTo(0, 30)
		w.reconcile(t) // first sight
		time.Sleep(time.Minute)
		w.reconcile(t)
		first := time.Now().Truncate(time.Minute)
		for _, leg := range []string{"slow (a=x)", "slow (a=y)"} {
			if c, _ := w.keeper.Get(tickKey(leg, first)); c.Status != "queued" {
				t.Fatalf("the first tick's %s: %q, want queued", leg, c.Status)
			}
		}
		w.drop(t, tickKey("slow (a=x)", first))
		time.Sleep(time.Minute)
		w.reconcile(t)
		second := time.Now().Truncate(time.Minute)
		if _, known := w.keeper.Get(tickKey("slow (a=x)", second)); known {
			t.Error("the second tick was queued while a leg of the first is still queued")
		}
		w.drop(t, tickKey("slow (a=y)", first))
		time.Sleep(time.Minute)
		w.reconcile(t)
		if c, _ := w.keeper.Get(tickKey("slow (a=y)", time.Now().Truncate(time.Minute))); c.Status != "queued" {
			t.Errorf("the third tick: %q, want queued", c.Status)
		}
	})
}
