package daemon

import (
	"slices"
	"testing"
	"testing/synctest"

	"knotless.dev/run/internal/parts/lander"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/rules/workflow"
)

// The merge queue through serve (each of its rules is tested in
// internal/parts/lander, with the lander's real neighbours).

// A lander whose push to one repository's source does not end holds
// neither intake nor any other repository: a push event in another
// repository, seen while the lander waits, gets its running check and
// runs to the end; the batch lands once the source answers.
func TestSlowLanderDelaysNoPushEvent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Lander = lander.Config{Queue: true, Batch: lander.DefaultBatch} })
		h.lister.SetRepos(rig.QueueRepo([]string{rig.Runner}, []string{rig.Runner}))
		h.git.SetWorkflows(
			&workflow.Workflow{Name: "pre", File: ".knotless/workflows/pre.yaml", On: []workflow.Trigger{workflow.Pull}, Queue: "first",
				Steps: []workflow.Step{{Name: "check", Run: "make check"}}},
			&workflow.Workflow{Name: "batch", File: ".knotless/workflows/batch.yaml", On: []workflow.Trigger{workflow.Batch},
				Steps: []workflow.Step{{Name: "test", Run: "make test"}}},
			&workflow.Workflow{Name: "ci", File: ".knotless/workflows/ci.yaml", On: []workflow.Trigger{workflow.Push},
				Steps: []workflow.Step{{Name: "build", Run: "make"}}},
		)
		gate, pushing := make(chan struct{}), make(chan struct{})
		h.git.Lock()
		h.git.PushGate, h.git.Pushing = gate, pushing
		h.git.Unlock()
		_, head := h.queue.QueuePull(h.git, 1, "a.txt")
		stop := h.serve(t)
		<-pushing // the lander waits on the source
		synctest.Wait()

		other := rig.Push("3k9", "c9")
		other.Repo = rig.OtherRepo("other")
		h.lister.Set(other)
		h.d.intake.Wake()
		synctest.Wait()
		if got := h.statuses(other, "ci"); !slices.Contains(got, "running") {
			t.Errorf("the other repository's push while the lander pushes: checks %q, want it running", got)
		}
		close(gate)
		synctest.Wait()
		stop()
		if c := h.final(other, "ci"); c.Status != "success" {
			t.Errorf("the other repository's push: %q, want success", c.Status)
		}
		if got := h.git.Landed("main"); !slices.Equal(got, []string{head}) {
			t.Errorf("landed %q, want the batch pushed once the source answers", got)
		}
	})
}
