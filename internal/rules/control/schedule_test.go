package control

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/workflow"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func crons(specs ...string) []workflow.Cron {
	var cs []workflow.Cron
	for _, s := range specs {
		cs = append(cs, workflow.Cron{Spec: s})
	}
	return cs
}

func TestDue(t *testing.T) {
	t.Parallel()
	var zero time.Time
	tests := []struct {
		name      string
		crons     []workflow.Cron
		last, now time.Time
		want      Tick
	}{
		{"the tick just passed", crons("0 3 * * *"), at("2026-12-04T03:00:00Z"), at("2026-12-05T03:00:20Z"),
			Tick{Run: at("2026-12-05T03:00:00Z"), Next: at("2026-12-06T03:00:00Z")}},
		{"a tick exactly now", crons("0 3 * * *"), at("2026-12-04T03:00:00Z"), at("2026-12-05T03:00:00Z"),
			Tick{Run: at("2026-12-05T03:00:00Z"), Next: at("2026-12-06T03:00:00Z")}},
		{"already run", crons("0 3 * * *"), at("2026-12-05T03:00:00Z"), at("2026-12-05T12:00:00Z"),
			Tick{Next: at("2026-12-06T03:00:00Z")}},
		{"down for days: the newest missed tick, once", crons("0 3 * * *"), at("2026-11-01T03:00:00Z"), at("2026-12-05T12:00:00Z"),
			Tick{Run: at("2026-12-05T03:00:00Z"), Next: at("2026-12-06T03:00:00Z")}},
		{"down for years, every minute", crons("* * * * *"), at("2020-01-01T00:00:00Z"), at("2026-12-05T12:34:56Z"),
			Tick{Run: at("2026-12-05T12:34:00Z"), Next: at("2026-12-05T12:35:00Z")}},
		{"down for years, yearly", crons("@yearly"), at("2019-06-01T00:00:00Z"), at("2026-12-05T12:00:00Z"),
			Tick{Run: at("2026-01-01T00:00:00Z"), Next: at("2027-01-01T00:00:00Z")}},
		{"a cluster of ticks far back", crons("* 3 * * *"), at("2026-12-01T00:00:00Z"), at("2026-12-05T23:59:00Z"),
			Tick{Run: at("2026-12-05T03:59:00Z"), Next: at("2026-12-06T03:00:00Z")}},
		{"never run: waits for the next tick", crons("0 3 * * *"), zero, at("2026-12-05T12:00:00Z"),
			Tick{Next: at("2026-12-06T03:00:00Z")}},
		{"first seen before a tick", crons("0 3 * * *"), at("2026-12-05T02:00:00Z"), at("2026-12-05T03:00:01Z"),
			Tick{Run: at("2026-12-05T03:00:00Z"), Next: at("2026-12-06T03:00:00Z")}},
		{"last in the future (a clock set back)", crons("0 3 * * *"), at("2027-01-01T00:00:00Z"), at("2026-12-05T12:00:00Z"),
			Tick{Next: at("2026-12-06T03:00:00Z")}},
		{"the newest of several crons", crons("0 3 * * *", "30 11 * * *", "0 0 1 1 *"), at("2026-12-01T00:00:00Z"), at("2026-12-05T12:00:00Z"),
			Tick{Run: at("2026-12-05T11:30:00Z"), Next: at("2026-12-06T03:00:00Z")}},
		{"two crons on the same minute are one tick", crons("0 3 * * *", "0 3 * * 5"), at("2026-12-03T12:00:00Z"), at("2026-12-04T04:00:00Z"),
			Tick{Run: at("2026-12-04T03:00:00Z"), Next: at("2026-12-05T03:00:00Z")}},
		{"never fires", crons("0 0 30 2 *"), at("2026-01-01T00:00:00Z"), at("2026-12-05T12:00:00Z"), Tick{}},
		{"local times are read as UTC instants", crons("0 3 * * *"), at("2026-12-04T03:00:00Z"), at("2026-12-05T05:00:20+02:00"),
			Tick{Run: at("2026-12-05T03:00:00Z"), Next: at("2026-12-06T03:00:00Z")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Due(tt.crons, tt.last, tt.now)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Run.IsZero() && got.Run.Location() != time.UTC || !got.Next.IsZero() && got.Next.Location() != time.UTC {
				t.Errorf("tick not in UTC: %v", got)
			}
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
				t.Errorf("Due (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := Due(crons("@every 1h"), zero, at("2026-12-05T12:00:00Z")); err == nil {
		t.Error("Due took @every")
	}
}

// TestDueRunsEachTickOnce walks a week minute by minute, as a runner
// polling would, and a runner that restarts with what it recorded: each
// tick of the cron runs exactly once, and the runs are the ticks.
func TestDueRunsEachTickOnce(t *testing.T) {
	t.Parallel()
	cs := crons("*/7 9-17 * * 1-5", "@daily")
	start := at("2026-11-30T00:00:00Z")
	last := start
	var runs []time.Time
	for now := start; now.Before(start.Add(7 * 24 * time.Hour)); now = now.Add(50 * time.Second) {
		tick, err := Due(cs, last, now)
		if err != nil {
			t.Fatal(err)
		}
		if !tick.Run.IsZero() {
			runs = append(runs, tick.Run)
			last = tick.Run
		}
	}
	var want []time.Time
	for _, c := range cs {
		s, _ := workflow.ParseCron(c.Spec)
		for t := s.Next(start); t.Before(start.Add(7*24*time.Hour - 50*time.Second)); t = s.Next(t) {
			want = append(want, t)
		}
	}
	seen := map[time.Time]bool{}
	for _, r := range runs {
		if seen[r] {
			t.Fatalf("tick %v ran twice", r)
		}
		seen[r] = true
	}
	for _, w := range want {
		if !seen[w] {
			t.Errorf("tick %v never ran", w)
		}
	}
	if len(runs) != len(seen) || len(seen) > len(want) {
		t.Errorf("%d runs for %d ticks", len(runs), len(want))
	}
}

func TestTickIDAndSubject(t *testing.T) {
	t.Parallel()
	tick := at("2026-12-05T05:00:00+02:00")
	if got := TickID(tick); got != "2026-12-05T03:00:00Z" {
		t.Errorf("TickID = %q", got)
	}
	got := ScheduleSubject(repo, "refs/heads/main", commit, tick)
	want := forge.Subject{Repo: repo, Commit: commit, Ref: "refs/heads/main", Event: repo, Kind: forge.KindSchedule, Tick: "2026-12-05T03:00:00Z"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
}
