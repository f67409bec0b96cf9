package runctl

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/rules/control"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
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
// Reading the schedules costs a fetch of the default branch, so run
// control keeps what it read per repository and reads again only when
// a tick is due, the newest push to that branch changed, or the process
// is new. Intake's reconcile loop wakes at the next tick (Part.Next).
// What is kept of a workflow no longer scheduled at that head, or of a
// repository no longer served (by a listing that failed nowhere), is
// forgotten, in memory and in state.json.

// DefaultBranch is the branch a repository's schedules run on when its
// record names none.
const DefaultBranch = "main"

// SkipQueued is why a tick is skipped (Observer.TickSkipped): its
// workflow's previous tick is still queued.
const SkipQueued = "queued"

// repoSchedule is what run control knows of a repository's schedules.
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

// queuedTick is the newest tick of a workflow run control queued: its check
// and its tick.
type queuedTick struct {
	key, tick string
	// legs are the check keys of a matrix workflow's other legs (key is
	// the first's): the tick is queued while any of them is.
	legs []string
}

// runSchedules runs the ticks due of the repositories' scheduled
// workflows, and forgets the schedules of the repositories no longer
// served.
func (p *Part) runSchedules(ctx context.Context, snap *ingest.Snapshot) {
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
		p.mu.Lock()
		mem := p.schedules[uri]
		p.mu.Unlock()
		if mem == nil || mem.push != push || mem.retry || (!mem.next.IsZero() && !now.Before(mem.next)) {
			read, err := p.readSchedules(ctx, repo, branch, push)
			switch {
			case errors.Is(err, mirror.ErrNoBranch):
				// A repository without its default branch (yet) has no
				// schedules: read again when a push to it is seen, not
				// at every reconcile (a fetch each time, and a line).
				if mem == nil || mem.head != "" || mem.push != push {
					p.log.Info("no schedules: the default branch is not in the source; read again at its next push", "repo", uri, "branch", branch)
				}
				read = &repoSchedule{push: push}
			case err != nil:
				p.log.Warn("schedules not read; tried again at the next reconcile", "repo", uri, "branch", branch, "err", err)
				continue
			}
			mem = read
			p.forgetUnscheduled(uri, mem.workflows)
		} else if !mem.waiting {
			continue
		} else {
			mem = &repoSchedule{push: mem.push, head: mem.head, workflows: mem.workflows}
		}
		p.ticks(ctx, repo, branch, mem, now)
		p.mu.Lock()
		p.schedules[uri] = mem
		p.mu.Unlock()
	}
	if snap.Complete && ctx.Err() == nil {
		p.forgetUnserved(snap)
	}
}

// readSchedules reads the default branch's head and its scheduled
// workflows for this runner.
func (p *Part) readSchedules(ctx context.Context, repo forge.Record[forge.Repo], branch, push string) (*repoSchedule, error) {
	m, err := p.p.Mirrors.Open(ctx, job.MirrorKey(work.Event{Kind: forge.KindSchedule, URI: repo.URI, Repo: repo}))
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
		if len(wf.Schedule) > 0 && wf.Matches(workflow.Schedule, branch) && wf.AllowsRunner(p.runner) {
			mem.workflows = append(mem.workflows, wf)
		}
	}
	return mem, nil
}

// ticks runs the ticks due now of mem's workflows and sets mem's next
// tick and whether a due one could not be queued (retry) or waits for
// the owner's caps (waiting). The ticks of one minute are one event;
// a workflow whose previous tick is still queued is skipped.
func (p *Part) ticks(ctx context.Context, repo forge.Record[forge.Repo], branch string, mem *repoSchedule, now time.Time) {
	uri := repo.URI.String()
	due := map[time.Time][]string{}
	for _, wf := range mem.workflows {
		log := p.log.With("repo", uri, "workflow", wf.Name)
		last := p.p.State.ScheduleLast(uri, wf.Name)
		if last.IsZero() {
			// First seen now: its first tick is the next one.
			if err := p.p.State.SetScheduleLast(uri, wf.Name, now); err != nil {
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
		if q, ok := p.stillQueued(uri, wf.Name); ok {
			// A slow workflow holds one tick queued, not one per tick.
			log.Warn("schedule: tick skipped: the workflow's previous tick is still queued", "tick", control.TickID(t.Run),
				"queued_tick", q.tick, "queued_check", q.key)
			if p.p.Observer != nil {
				p.p.Observer.TickSkipped(SkipQueued)
			}
			if err := p.p.State.SetScheduleLast(uri, wf.Name, t.Run); err != nil {
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
		log := p.log.With("repo", uri, "tick", ev.Tick)
		if p.once.First("tick\x00" + ev.Key()) { // a waiting one is looked at again at each reconcile
			log.Info("schedule: tick due", "workflows", strings.Join(names, ","), "commit", mem.head)
		}
		if err := p.p.Intake.ConsiderControl(ctx, ev); err != nil {
			log.Error("scheduled run not queued; tried again at the next reconcile", "err", err)
			mem.retry = true
			continue
		}
		if !p.handled(ev, mem) {
			// Over the owner's caps (or its commit's fetch backing
			// off): not run yet, and not recorded as run; the newest
			// tick due runs once the owner's runs end.
			mem.waiting = true
			continue
		}
		for _, name := range names {
			if err := p.p.State.SetScheduleLast(uri, name, run); err != nil {
				log.Error("save state", "workflow", name, "err", err)
			}
			keys := tickKeys(ev, mem, name)
			p.noteQueuedTick(uri, name, queuedTick{key: keys[0], tick: ev.Tick, legs: keys[1:]})
		}
	}
}

// stillQueued is the newest tick queued of workflow wf of repo, when
// it is queued and not started yet.
func (p *Part) stillQueued(repo, wf string) (queuedTick, bool) {
	p.mu.Lock()
	q, ok := p.queuedTicks[repo][wf]
	p.mu.Unlock()
	if !ok {
		return queuedTick{}, false
	}
	if p.p.Scheduler.Waiting(q.key) || slices.ContainsFunc(q.legs, p.p.Scheduler.Waiting) {
		return q, true
	}
	return queuedTick{}, false
}

// noteQueuedTick remembers q as the newest tick queued of workflow wf
// of repo.
func (p *Part) noteQueuedTick(repo, wf string, q queuedTick) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queuedTicks[repo] == nil {
		p.queuedTicks[repo] = map[string]queuedTick{}
	}
	p.queuedTicks[repo][wf] = q
}

// handled reports whether a tick's event was taken: done (refused, or
// its checks final) or a job of it in hand. One that was not waits for
// the owner's caps, or for its commit's fetch to be tried again.
func (p *Part) handled(ev work.Event, mem *repoSchedule) bool {
	if p.p.State.Done(ev.Key()) {
		return true
	}
	for name := range ev.Workflows {
		for _, key := range tickKeys(ev, mem, name) {
			if p.p.Scheduler.HasCheck(key) || p.p.Checks.Final(key) {
				return true
			}
		}
	}
	return false
}

// tickKeys are the check keys of the tick ev of workflow name: its
// own, or a matrix's legs', in order.
func tickKeys(ev work.Event, mem *repoSchedule, name string) []string {
	i := slices.IndexFunc(mem.workflows, func(w *workflow.Workflow) bool { return w.Name == name })
	if i < 0 || mem.workflows[i].Matrix == nil {
		return []string{ev.CheckKey(name)}
	}
	var keys []string
	for _, leg := range mem.workflows[i].Legs() {
		keys = append(keys, ev.CheckKey(leg.Name))
	}
	return keys
}

// forgetUnscheduled forgets what is kept of repo's workflows but those
// scheduled (read at the head of its default branch).
func (p *Part) forgetUnscheduled(repo string, scheduled []*workflow.Workflow) {
	names := make([]string, len(scheduled))
	for i, wf := range scheduled {
		names[i] = wf.Name
	}
	p.mu.Lock()
	for wf := range p.queuedTicks[repo] {
		if !slices.Contains(names, wf) {
			delete(p.queuedTicks[repo], wf)
		}
	}
	if len(p.queuedTicks[repo]) == 0 {
		delete(p.queuedTicks, repo)
	}
	p.mu.Unlock()
	n, err := p.p.State.KeepSchedules(repo, names)
	if err != nil {
		p.log.Error("save state", "err", err)
	}
	if n > 0 {
		p.log.Info("schedules no longer at the default branch's head forgotten", "repo", repo, "workflows", n)
	}
}

// forgetUnserved forgets the schedules of the repositories snap does
// not list; snap is complete (no listing of it failed).
func (p *Part) forgetUnserved(snap *ingest.Snapshot) {
	served := make([]string, len(snap.Repos))
	for i, r := range snap.Repos {
		served[i] = r.URI.String()
	}
	p.mu.Lock()
	for repo := range p.schedules {
		if !slices.Contains(served, repo) {
			delete(p.schedules, repo)
		}
	}
	for repo := range p.queuedTicks {
		if !slices.Contains(served, repo) {
			delete(p.queuedTicks, repo)
		}
	}
	p.mu.Unlock()
	n, err := p.p.State.KeepScheduleRepos(served)
	if err != nil {
		p.log.Error("save state", "err", err)
	}
	if n > 0 {
		p.log.Info("schedules of repositories no longer served forgotten", "repos", n)
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
