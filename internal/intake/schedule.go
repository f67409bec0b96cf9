package intake

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"knotless.dev/run/internal/control"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/job"
	"knotless.dev/run/internal/work"
	"knotless.dev/run/internal/workflow"
)

// Schedules: a workflow with on: schedule runs on its repository's
// default branch's head at its cron ticks, trusted, kind schedule, its
// check keyed by the tick (docs/design/protocol.md, "Schedules"). Which
// tick runs is control.Due's: the newest one since the last run (kept
// in state.json per repository and workflow; on first sight, now), so
// a runner that was down runs a missed tick once. The tick's check is
// written before the tick is recorded as run: a process killed in
// between finds the same tick due again, or, when a newer one is due,
// the check it left not final (resume), so each tick runs once.
//
// Nothing but the workflow files bounds ticks, and the owner may write
// a hundred that tick every minute, so they are floods like any other
// work: a repository's ticks of one minute are one event (the caps'
// --max-workflows-per-event refuses more, with one error check), its
// runs and check writes count against the repository's owner whatever
// --limits-apply-to says (job.Author; over a cap the tick waits, not
// recorded as run, and the newest one due runs once the owner's runs
// end), and a tick whose workflow's previous tick is still queued is
// skipped (logged, counted: Observer.TickSkipped), so a slow workflow
// holds at most one tick queued.
//
// Reading the schedules costs a fetch of the default branch, so intake
// keeps what it read per repository and reads again only when a tick is
// due, the newest push to that branch changed, or the process is new.
// The reconcile loop wakes at the next tick (nextTick). What is kept of
// a workflow no longer scheduled at that head, or of a repository no
// longer served (by a listing that failed nowhere), is forgotten, in
// memory and in state.json.

// DefaultBranch is the branch a repository's schedules run on when its
// record names none.
const DefaultBranch = "main"

// SkipQueued is why a tick is skipped (Observer.TickSkipped): its
// workflow's previous tick is still queued.
const SkipQueued = "queued"

// repoSchedule is what intake knows of a repository's schedules.
type repoSchedule struct {
	// push is the newest push to the default branch listed when they
	// were read (its event key): a newer one may change them.
	push string
	// workflows are its scheduled workflows, as read at head.
	head      string
	workflows []*workflow.Workflow
	// next is the earliest next tick of any of them (zero: none);
	// retry is set when a due tick could not be queued (read again at
	// the next reconcile), waiting when a due tick waits for the
	// owner's caps (looked at again at each reconcile, from what was
	// read).
	next    time.Time
	retry   bool
	waiting bool
}

// queuedTick is the newest tick of a workflow intake queued: its check
// and its tick.
type queuedTick struct {
	key, tick string
}

// runSchedules runs the ticks due of the repositories' scheduled
// workflows, and forgets the schedules of the repositories no longer
// served.
func (in *Intake) runSchedules(ctx context.Context, snap *ingest.Snapshot) {
	for _, repo := range snap.Repos {
		if ctx.Err() != nil {
			return
		}
		uri := repo.URI.String()
		branch := repo.Value.DefaultBranch
		if branch == "" {
			branch = DefaultBranch
		}
		push := newestPush(snap, uri, "refs/heads/"+branch)
		now := time.Now()
		in.mu.Lock()
		mem := in.schedules[uri]
		in.mu.Unlock()
		if mem == nil || mem.push != push || mem.retry || (!mem.next.IsZero() && !now.Before(mem.next)) {
			read, err := in.readSchedules(ctx, repo, branch, push)
			if err != nil {
				in.log.Warn("schedules not read; tried again at the next reconcile", "repo", uri, "branch", branch, "err", err)
				continue
			}
			mem = read
			in.forgetUnscheduled(uri, mem.workflows)
		} else if !mem.waiting {
			continue
		} else {
			mem = &repoSchedule{push: mem.push, head: mem.head, workflows: mem.workflows}
		}
		in.ticks(ctx, repo, branch, mem, now)
		in.mu.Lock()
		in.schedules[uri] = mem
		in.mu.Unlock()
	}
	if snap.Complete && ctx.Err() == nil {
		in.forgetUnserved(snap)
	}
}

// readSchedules reads the default branch's head and its scheduled
// workflows for this runner.
func (in *Intake) readSchedules(ctx context.Context, repo forge.Record[forge.Repo], branch, push string) (*repoSchedule, error) {
	m, err := in.p.Mirrors.Open(ctx, job.MirrorKey(work.Event{Kind: forge.KindSchedule, URI: repo.URI, Repo: repo}))
	if err != nil {
		return nil, err
	}
	head, err := m.Branch(ctx, repo.Value.Source, branch)
	if err != nil {
		return nil, err
	}
	wfs, _, err := m.Workflows(ctx, head)
	if err != nil {
		return nil, err
	}
	mem := &repoSchedule{push: push, head: head}
	for _, wf := range wfs {
		if len(wf.Schedule) > 0 && wf.Matches(workflow.Schedule, branch) && wf.AllowsRunner(in.facts.Runner.String()) {
			mem.workflows = append(mem.workflows, wf)
		}
	}
	return mem, nil
}

// ticks runs the ticks due now of mem's workflows and sets mem's next
// tick and whether a due one could not be queued (retry) or waits for
// the owner's caps (waiting). The ticks of one minute are one event;
// a workflow whose previous tick is still queued is skipped.
func (in *Intake) ticks(ctx context.Context, repo forge.Record[forge.Repo], branch string, mem *repoSchedule, now time.Time) {
	uri := repo.URI.String()
	due := map[time.Time][]string{}
	for _, wf := range mem.workflows {
		log := in.log.With("repo", uri, "workflow", wf.Name)
		last := in.p.State.ScheduleLast(uri, wf.Name)
		if last.IsZero() {
			// First seen now: its first tick is the next one.
			if err := in.p.State.SetScheduleLast(uri, wf.Name, now); err != nil {
				log.Error("save state", "err", err)
			}
			last = now
		}
		t, err := control.Due(wf.Schedule, last, now)
		if err != nil {
			log.Warn("schedule unreadable", "err", err)
			continue
		}
		if !t.Next.IsZero() && (mem.next.IsZero() || t.Next.Before(mem.next)) {
			mem.next = t.Next
		}
		if t.Run.IsZero() {
			continue
		}
		if q, ok := in.stillQueued(uri, wf.Name); ok {
			// A slow workflow holds one tick queued, not one per tick.
			log.Warn("schedule: tick skipped: the workflow's previous tick is still queued", "tick", control.TickID(t.Run),
				"queued_tick", q.tick, "queued_check", q.key)
			if in.p.Observer != nil {
				in.p.Observer.TickSkipped(SkipQueued)
			}
			if err := in.p.State.SetScheduleLast(uri, wf.Name, t.Run); err != nil {
				log.Error("save state", "err", err)
			}
			continue
		}
		due[t.Run] = append(due[t.Run], wf.Name)
	}
	for _, run := range slices.SortedFunc(maps.Keys(due), time.Time.Compare) {
		names := due[run]
		ev := work.Event{Kind: forge.KindSchedule, URI: repo.URI, Repo: repo, Ref: "refs/heads/" + branch, Commit: mem.head, Trusted: true,
			Control: work.Control{Workflows: map[string]int64{}, Tick: control.TickID(run)}}
		for _, name := range names {
			ev.Workflows[name] = 1
		}
		log := in.log.With("repo", uri, "tick", ev.Tick)
		if in.once.first("tick\x00" + ev.Key()) { // a waiting one is looked at again at each reconcile
			log.Info("schedule: tick due", "workflows", strings.Join(names, ","), "commit", mem.head)
		}
		if err := in.considerControl(ctx, ev); err != nil {
			log.Error("scheduled run not queued; tried again at the next reconcile", "err", err)
			mem.retry = true
			continue
		}
		if !in.handled(ev) {
			// Over the owner's caps (or its commit's fetch backing
			// off): not run yet, and not recorded as run; the newest
			// tick due runs once the owner's runs end.
			mem.waiting = true
			continue
		}
		for _, name := range names {
			if err := in.p.State.SetScheduleLast(uri, name, run); err != nil {
				log.Error("save state", "workflow", name, "err", err)
			}
			in.noteQueuedTick(uri, name, queuedTick{key: ev.CheckKey(name), tick: ev.Tick})
		}
	}
}

// stillQueued is the newest tick queued of workflow wf of repo, when
// it is queued and not started yet.
func (in *Intake) stillQueued(repo, wf string) (queuedTick, bool) {
	in.mu.Lock()
	q, ok := in.queuedTicks[repo][wf]
	in.mu.Unlock()
	if !ok || !in.p.Scheduler.Waiting(q.key) {
		return queuedTick{}, false
	}
	return q, true
}

// noteQueuedTick remembers q as the newest tick queued of workflow wf
// of repo.
func (in *Intake) noteQueuedTick(repo, wf string, q queuedTick) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.queuedTicks[repo] == nil {
		in.queuedTicks[repo] = map[string]queuedTick{}
	}
	in.queuedTicks[repo][wf] = q
}

// handled reports whether a tick's event was taken: done (refused, or
// its checks final) or a job of it in hand. One that was not waits for
// the owner's caps, or for its commit's fetch to be tried again.
func (in *Intake) handled(ev work.Event) bool {
	if in.p.State.Done(ev.Key()) {
		return true
	}
	for name := range ev.Workflows {
		if key := ev.CheckKey(name); in.p.Scheduler.HasCheck(key) || in.p.Checks.Final(key) {
			return true
		}
	}
	return false
}

// forgetUnscheduled forgets what is kept of repo's workflows but those
// scheduled (read at the head of its default branch).
func (in *Intake) forgetUnscheduled(repo string, scheduled []*workflow.Workflow) {
	names := make([]string, len(scheduled))
	for i, wf := range scheduled {
		names[i] = wf.Name
	}
	in.mu.Lock()
	for wf := range in.queuedTicks[repo] {
		if !slices.Contains(names, wf) {
			delete(in.queuedTicks[repo], wf)
		}
	}
	if len(in.queuedTicks[repo]) == 0 {
		delete(in.queuedTicks, repo)
	}
	in.mu.Unlock()
	n, err := in.p.State.KeepSchedules(repo, names)
	if err != nil {
		in.log.Error("save state", "err", err)
	}
	if n > 0 {
		in.log.Info("schedules no longer at the default branch's head forgotten", "repo", repo, "workflows", n)
	}
}

// forgetUnserved forgets the schedules of the repositories snap does
// not list; snap is complete (no listing of it failed).
func (in *Intake) forgetUnserved(snap *ingest.Snapshot) {
	served := make([]string, len(snap.Repos))
	for i, r := range snap.Repos {
		served[i] = r.URI.String()
	}
	in.mu.Lock()
	for repo := range in.schedules {
		if !slices.Contains(served, repo) {
			delete(in.schedules, repo)
		}
	}
	for repo := range in.queuedTicks {
		if !slices.Contains(served, repo) {
			delete(in.queuedTicks, repo)
		}
	}
	in.mu.Unlock()
	n, err := in.p.State.KeepScheduleRepos(served)
	if err != nil {
		in.log.Error("save state", "err", err)
	}
	if n > 0 {
		in.log.Info("schedules of repositories no longer served forgotten", "repos", n)
	}
}

// newestPush is the key of the newest push to ref of repository repo
// listed ("" when none is).
func newestPush(snap *ingest.Snapshot, repo, ref string) string {
	newest := ""
	for _, ev := range snap.Events { // oldest first
		if ev.Kind == forge.KindPush && ev.Repo.URI.String() == repo && ev.Ref == ref {
			newest = ev.Key()
		}
	}
	return newest
}

// nextTick is a channel that fires at the earliest next tick of the
// schedules known (nil: none), and the stop of its timer.
func (in *Intake) nextTick() (<-chan time.Time, func()) {
	in.mu.Lock()
	var next time.Time
	for _, m := range in.schedules {
		if !m.next.IsZero() && (next.IsZero() || m.next.Before(next)) {
			next = m.next
		}
	}
	in.mu.Unlock()
	if next.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(next))
	return t.C, func() { t.Stop() }
}
