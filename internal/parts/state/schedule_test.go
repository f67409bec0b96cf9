package state

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The schedules' memory follows what is scheduled: a workflow no
// longer scheduled at its repository's head, and a repository no
// longer served, are forgotten, on disk too; the others are kept.
func TestKeepSchedules(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	for _, e := range []struct{ repo, wf string }{{"a", "nightly"}, {"a", "hourly"}, {"b", "nightly"}, {"c", "nightly"}} {
		if err := s.SetScheduleLast(e.repo, e.wf, at); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.KeepSchedules("a", []string{"nightly", "new"}); err != nil || n != 1 {
		t.Fatalf("KeepSchedules: forgot %d (%v), want 1", n, err)
	}
	if n, err := s.KeepSchedules("b", nil); err != nil || n != 1 {
		t.Fatalf("KeepSchedules of none: forgot %d (%v), want 1", n, err)
	}
	if n, err := s.KeepScheduleRepos([]string{"a", "b", "d"}); err != nil || n != 1 {
		t.Fatalf("KeepScheduleRepos: forgot %d (%v), want 1 (c)", n, err)
	}
	want := map[string]map[string]time.Time{"a": {"nightly": at}}
	if diff := cmp.Diff(want, s.Snapshot().Schedules); diff != "" {
		t.Errorf("schedules (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, onDisk(t, s).Schedules); diff != "" {
		t.Errorf("schedules on disk (-want +got):\n%s", diff)
	}
	if got := s.ScheduleLast("a", "hourly"); !got.IsZero() {
		t.Errorf("a forgotten schedule's last tick %s, want none", got)
	}
	// Nothing to forget: nothing written.
	if n, err := s.KeepScheduleRepos([]string{"a"}); err != nil || n != 0 {
		t.Errorf("KeepScheduleRepos again: forgot %d (%v), want 0", n, err)
	}
}
