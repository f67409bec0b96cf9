package daemon

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"

	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/work"
)

// envEventsAtOnce sets how many events TestServeEventsAtOnce delivers
// (1,000, the figure, by default).
const envEventsAtOnce = "KNOTLESS_EVENTS_AT_ONCE"

// TestServeEventsAtOnce: 1,000 pushes (each to a branch of its own, so
// none supersedes another) listed at once, with 4 workers held by their
// steps: every one gets a check at once, none is dropped: the 4 that
// found a worker running, the others queued, each saying how many runs
// waited ahead of it, every count from 0 to 995 once. Released, each
// ends success, its checks exactly queued (or not, if a worker was
// free), running, success, on its own commit. The counts are the
// figures of docs/performance.md; the bubble's clock makes no time
// figure.
func TestServeEventsAtOnce(t *testing.T) {
	t.Parallel()
	n := 1000
	if s := os.Getenv(envEventsAtOnce); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 5 {
			t.Fatalf("%s=%q: want a count of 5 or more", envEventsAtOnce, s)
		}
	}
	const workers = 4
	synctest.Test(t, func(t *testing.T) {
		h, log := countWrites(t, intake.NoCap, func(c *Config) { c.Scheduler.Concurrency = workers })
		gate := make(chan struct{})
		h.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		h.git.SetWorkflows(rig.CI("ci", "make"))
		events := make([]work.Event, n)
		for i := range events {
			ev := rig.Push(fmt.Sprintf("3k%04d", i), fmt.Sprintf("c%04d", i))
			ev.Ref = fmt.Sprintf("refs/heads/b%04d", i)
			events[i] = ev
		}
		h.lister.Set(events...)
		stop := h.serve(t)
		synctest.Wait()

		running, behind := 0, map[int64]int{}
		for _, ev := range events {
			got := log.of(ev)
			switch {
			case slices.Equal(got, []string{"ci running"}):
				running++
			case len(got) == 1 && got[0] == "ci queued":
				behind[h.final(ev, "ci").QueuedBehind]++
			default:
				t.Errorf("%s: checks %v while the workers are held, want one running or one queued", ev.Commit, got)
			}
		}
		queued := 0
		for b, k := range behind {
			queued += k
			if k != 1 || b < 0 || b >= int64(n-workers) {
				t.Errorf("%d queued checks say %d runs wait ahead, want one each of 0 to %d", k, b, n-workers-1)
			}
		}
		t.Logf("%d events at once: %d running, %d queued (%d distinct positions), %d without a check", n, running, queued, len(behind), n-running-queued)
		if running != workers || queued != n-workers {
			t.Errorf("%d running and %d queued, want %d and %d", running, queued, workers, n-workers)
		}

		close(gate)
		synctest.Wait()
		stop()
		writes := 0
		for _, ev := range events {
			got := log.of(ev)
			writes += len(got)
			if want := []string{"ci queued", "ci running", "ci success"}; !slices.Equal(got, want) && !slices.Equal(got, want[1:]) {
				t.Errorf("%s: checks %v, want %v (queued left out if a worker was free)", ev.Commit, got, want)
			}
			if c := h.final(ev, "ci"); c.Subject.Commit != ev.Commit || c.Status != "success" {
				t.Errorf("%s: final check on %s is %s", ev.Commit, c.Subject.Commit, c.Status)
			}
		}
		if st := h.saved(t); len(st.Done) != n || len(st.Runs) != 0 {
			t.Errorf("state.json: %d events done, %d runs left; want %d and none", len(st.Done), len(st.Runs), n)
		}
		t.Logf("%d events at once: %d check writes, every event final success", n, writes)
	})
}
