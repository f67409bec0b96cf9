package control

import (
	"fmt"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/workflow"
)

// Tick is what a schedule does now.
type Tick struct {
	// Run is the tick to run now; zero when none is due.
	Run time.Time
	// Next is the first tick after now: when to look again (zero when
	// the crons never fire again).
	Next time.Time
}

// Due decides which tick of a workflow's schedule runs now: the newest
// tick of any of its crons in (last, now], once, however many were
// missed. last is the newest tick already run; for a schedule never run,
// it is when the runner first saw it (so a new schedule, or one whose
// state was lost, waits for its next tick instead of running an old
// one); the zero time counts as now. The tick's id (TickID) goes into
// the check's key, so a tick two processes both decide to run is one
// check. Ticks are whole minutes, in UTC.
func Due(crons []workflow.Cron, last, now time.Time) (Tick, error) {
	now = now.UTC()
	if last.IsZero() || last.After(now) {
		last = now
	}
	last = last.UTC()
	var t Tick
	for _, c := range crons {
		sched, err := workflow.ParseCron(c.Spec)
		if err != nil {
			return Tick{}, fmt.Errorf("schedule %q: %w", c.Spec, err)
		}
		if run := newest(sched.Next, last, now); run.After(t.Run) {
			t.Run = run
		}
		if next := sched.Next(now); !next.IsZero() && (t.Next.IsZero() || next.Before(t.Next)) {
			t.Next = next
		}
	}
	return t, nil
}

// newest is the newest time next yields in (last, now], or zero. It
// looks back from now over windows that double, so a runner down for
// years costs a few dozen calls, not one per missed tick: the first
// window holding a tick has no tick in its newer half (the window
// before), so walking it forward is short.
func newest(next func(time.Time) time.Time, last, now time.Time) time.Time {
	for d := time.Minute; ; d *= 2 {
		from := now.Add(-d)
		final := !from.After(last)
		if final {
			from = last
		}
		t := next(from)
		if !t.IsZero() && !t.After(now) {
			for {
				n := next(t)
				if n.IsZero() || n.After(now) {
					return t
				}
				t = n
			}
		}
		if final {
			return time.Time{}
		}
	}
}

// TickID is a tick as the check's subject and key take it: RFC 3339 in
// UTC, to the second.
func TickID(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// ScheduleSubject is the check subject of the tick of the repository
// repo's schedule, run on its default branch ref at commit.
func ScheduleSubject(repo, ref, commit string, tick time.Time) forge.Subject {
	return forge.Subject{Repo: repo, Commit: commit, Ref: ref, Event: repo, Kind: forge.KindSchedule, Tick: TickID(tick)}
}
