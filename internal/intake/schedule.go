package intake

import (
	"context"
	"time"

	"knotless.dev/run/internal/control"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/job"
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
// Reading the schedules costs a fetch of the default branch, so intake
// keeps what it read per repository and reads again only when a tick is
// due, the newest push to that branch changed, or the process is new.
// The reconcile loop wakes at the next tick (nextTick).

// DefaultBranch is the branch a repository's schedules run on when its
// record names none.
const DefaultBranch = "main"

// repoSchedule is what intake knows of a repository's schedules.
type repoSchedule struct {
	// push is the newest push to the default branch listed when they
	// were read (its event key): a newer one may change them.
	push string
	// workflows are its scheduled workflows, as read at head.
	head      string
	workflows []*workflow.Workflow
	// next is the earliest next tick of any of them (zero: none);
	// retry is set when a due tick could not be queued.
	next  time.Time
	retry bool
}

// runSchedules runs the ticks due of the repositories' scheduled
// workflows.
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
		if mem != nil && mem.push == push && !mem.retry && (mem.next.IsZero() || now.Before(mem.next)) {
			continue
		}
		mem, err := in.readSchedules(ctx, repo, branch, push)
		if err != nil {
			in.log.Warn("schedules not read; tried again at the next reconcile", "repo", uri, "branch", branch, "err", err)
			continue
		}
		for _, wf := range mem.workflows {
			next, ok := in.tick(ctx, repo, branch, mem.head, wf, now)
			mem.retry = mem.retry || !ok
			if !next.IsZero() && (mem.next.IsZero() || next.Before(mem.next)) {
				mem.next = next
			}
		}
		in.mu.Lock()
		in.schedules[uri] = mem
		in.mu.Unlock()
	}
}

// readSchedules reads the default branch's head and its scheduled
// workflows for this runner.
func (in *Intake) readSchedules(ctx context.Context, repo forge.Record[forge.Repo], branch, push string) (*repoSchedule, error) {
	m, err := in.p.Mirrors.Open(ctx, job.MirrorKey(ingest.Event{Kind: forge.KindSchedule, URI: repo.URI, Repo: repo}))
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

// tick runs wf's tick due now, if one is, and returns its next tick;
// ok is false when a due tick could not be queued (it is due again at
// the next reconcile).
func (in *Intake) tick(ctx context.Context, repo forge.Record[forge.Repo], branch, head string, wf *workflow.Workflow, now time.Time) (next time.Time, ok bool) {
	uri := repo.URI.String()
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
		return time.Time{}, true
	}
	if t.Run.IsZero() {
		return t.Next, true
	}
	ev := ingest.Event{Kind: forge.KindSchedule, URI: repo.URI, Repo: repo, Ref: "refs/heads/" + branch, Commit: head, Trusted: true,
		Control: ingest.Control{Workflows: map[string]int64{wf.Name: 1}, Tick: control.TickID(t.Run)}}
	log.Info("schedule: tick due", "tick", ev.Tick, "commit", head, "last", last)
	if err := in.considerControl(ctx, ev); err != nil {
		log.Error("scheduled run not queued; tried again at the next reconcile", "tick", ev.Tick, "err", err)
		return t.Next, false
	}
	if err := in.p.State.SetScheduleLast(uri, wf.Name, t.Run); err != nil {
		log.Error("save state", "err", err)
	}
	return t.Next, true
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
