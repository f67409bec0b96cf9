package lander

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/parts/rig"
)

// The lander on the rig with its real neighbours (rig_test.go): the
// owner's queue entries, the pulls and the lander's own records in a
// rig.Queue, the source and its squashes in the rig's commit model, the
// pre-flights and batches run by fakeexec, all in a synctest bubble.
// The real-PDS tests (internal/daemon: mergequeue_test.go,
// lander_kill_test.go) cover the same ground with real git and a real
// PDS.

// A two-pull batch: both pre-flights pass, the pulls are squashed onto
// main in queue order, the batch's checks pass, main is pushed once and
// one landing records it.
func TestLanderLandsTwoPullsInOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, _ := newLanderWorld(t)
		p2, h2 := w.queuePull(2, "b.txt")
		p1, h1 := w.queuePull(1, "a.txt")
		w.serveUntilIdle(t)

		if diff := cmp.Diff([]string{h1, h2}, w.git.Landed("main")); diff != "" {
			t.Errorf("pulls on main (-want +got):\n%s", diff)
		}
		if len(w.git.Pushes()) != 1 {
			t.Errorf("pushes %q, want one", w.git.Pushes())
		}
		bs := w.queue.BatchList()
		if len(bs) != 1 || bs[0].Status != forge.BatchLanded || !slices.Equal(batchPulls(bs[0]), []string{p1, p2}) {
			t.Fatalf("batches %+v, want one landed batch of pull 1 then 2", bs)
		}
		ls := w.queue.Landings()
		want := []forge.Landing{{Type: forge.CollectionLanding, Repo: rig.Repo, Ref: "refs/heads/main", Old: rig.BaseCommit("main"),
			New: w.git.Head("main"), Batch: string(rig.OwnURI(forge.CollectionBatch, forge.BatchKey(rig.Repo, bs[0].Base, bs[0].Pulls)))}}
		for i := range ls {
			ls[i].CreatedAt = ""
		}
		if diff := cmp.Diff(want, ls); diff != "" {
			t.Errorf("landings (-want +got):\n%s", diff)
		}
		if len(w.queue.Reasons()) != 0 {
			t.Errorf("ejections %v, want none", w.queue.Reasons())
		}
		// The one worker was free for the first pre-flight (its check's
		// first record is its running one); the second waited, queued.
		var firsts []string
		for _, p := range []string{p1, p2} {
			ev := preflightEvent(rig.RepoRecord(), p, forge.Pull{Base: "main", Head: forge.PullHead{Commit: w.queue.GetPull(p).Head.Commit}})
			got := w.statuses(ev, "pre")
			if len(got) > 0 {
				firsts = append(firsts, got[0])
			}
			if !slices.Equal(got, []string{"queued", "running", "success"}) && !slices.Equal(got, []string{"running", "success"}) {
				t.Errorf("pre-flight of %s: %q", p, got)
			}
		}
		if slices.Sort(firsts); !slices.Equal(firsts, []string{"queued", "running"}) {
			t.Errorf("the pre-flights' first records %q, want one queued (it waited), one running (taken at once)", firsts)
		}
		if w.store.Lander(rig.Repo) == nil {
			t.Error("state.json keeps no lander memory for the repository")
		}
	})
}

// Each way a pull leaves the queue is recorded with its reason, and the
// other pulls land.
func TestLanderEjects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// setup queues pulls 1 (x.txt), 2 (y.txt) and 3 (z.txt) and
		// breaks one of them: the culprit.
		setup  func(w *world, s *queueScript, heads []string, uris []string)
		reason string
		detail string
	}{
		{"conflict with the base", func(w *world, _ *queueScript, heads, _ []string) {
			w.git.BaseConflicts = map[string]bool{heads[1]: true}
		}, forge.EjectConflictBase, "conflicts with the base branch"},
		{"conflict with an earlier pull", func(w *world, _ *queueScript, heads, _ []string) {
			w.git.SetPaths(heads[1], "y.txt", "x.txt")
		}, forge.EjectConflictPull, "conflicts with the earlier pull at://did:plc:author/dev.knotless.pull/3p1 of the batch: x.txt"},
		{"failing pre-flight", func(_ *world, s *queueScript, _, uris []string) {
			s.failPre[uris[1]] = true
		}, forge.EjectPreflight, "pre-flight workflow pre: failure in step check"},
		{"fails only in a batch", func(_ *world, s *queueScript, heads, _ []string) {
			s.culprit = heads[1]
		}, forge.EjectBatch, "fails in a batch on the base branch: workflow batch: failure"},
		{"head moved", func(w *world, _ *queueScript, _, uris []string) {
			p := w.queue.GetPull(uris[1])
			p.Head.Commit = rig.CommitID("pushed again")
			w.queue.SetPull(uris[1], p)
		}, forge.EjectHeadMoved, "the head moved from the approved"},
		{"closed", func(w *world, _ *queueScript, _, uris []string) {
			p := w.queue.GetPull(uris[1])
			p.State = "closed"
			w.queue.SetPull(uris[1], p)
		}, forge.EjectClosed, "no longer open"},
		{"pull record gone", func(w *world, _ *queueScript, _, uris []string) {
			w.queue.DeletePull(uris[1])
		}, forge.EjectClosed, "the pull record is gone"},
		{"base changed after queueing", func(w *world, _ *queueScript, _, uris []string) {
			p := w.queue.GetPull(uris[1])
			p.Base = "release"
			w.queue.SetPull(uris[1], p)
		}, forge.EjectBaseChanged, `base changed after queueing: the entry approved "main", the pull now targets "release"`},
		{"entry naming no base", func(w *world, _ *queueScript, _, _ []string) {
			w.queue.EditEntry(1, func(e *forge.QueueEntry) { e.Base = "" })
		}, forge.EjectNoBase, "the queue entry names no base branch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				w, s := newLanderWorld(t)
				var uris, heads []string
				for i, path := range []string{"x.txt", "y.txt", "z.txt"} {
					u, h := w.queuePull(i+1, path)
					uris, heads = append(uris, u), append(heads, h)
				}
				tc.setup(w, s, heads, uris)
				w.serveUntilIdle(t)

				if diff := cmp.Diff(map[string]string{uris[1]: tc.reason}, w.queue.Reasons()); diff != "" {
					t.Errorf("ejections (-want +got):\n%s", diff)
				}
				if ej := w.queue.Ejection(uris[1]); !strings.Contains(ej.Detail, tc.detail) || ej.Commit != heads[1] {
					t.Errorf("ejection %+v, want detail with %q at the approved commit", ej, tc.detail)
				}
				if diff := cmp.Diff([]string{heads[0], heads[2]}, w.git.Landed("main")); diff != "" {
					t.Errorf("pulls on main (-want +got):\n%s", diff)
				}
				if left := w.exec.Running(); len(left) != 0 {
					t.Errorf("sessions left: %v", left)
				}
			})
		})
	}
}

// A batch that fails only when squashed is bisected: the culprit is
// ejected with the batch's failure, the rest land, no pull twice.
func TestLanderBisects(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, s := newLanderWorld(t)
		var uris, heads []string
		for i := range 4 {
			u, h := w.queuePull(i+1, fmt.Sprintf("f%d.txt", i))
			uris, heads = append(uris, u), append(heads, h)
		}
		s.culprit = heads[2]
		w.serveUntilIdle(t)

		if diff := cmp.Diff([]string{heads[0], heads[1], heads[3]}, w.git.Landed("main")); diff != "" {
			t.Errorf("pulls on main (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]string{uris[2]: forge.EjectBatch}, w.queue.Reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
		if ej := w.queue.Ejection(uris[2]); ej.Batch == "" {
			t.Error("the ejection names no batch")
		}
		var statuses []string
		for _, b := range w.queue.BatchList() {
			statuses = append(statuses, fmt.Sprintf("%s %d", b.Status, len(b.Pulls)))
		}
		// 4 fail; its first half (2) lands; the other half fails, is
		// split, the culprit fails alone and the last lands.
		want := []string{"failed 4", "landed 2", "failed 2", "failed 1", "landed 1"}
		if diff := cmp.Diff(want, statuses); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		if len(w.queue.Landings()) != len(w.git.Pushes()) {
			t.Errorf("%d landings for %d pushes", len(w.queue.Landings()), len(w.git.Pushes()))
		}
	})
}

// The base branch moves between the batch's checks and its push: the
// lease refuses the push, the batch is void (rebuilt), and a new batch
// on the moved base lands; nothing is forced.
func TestLanderBaseMovedAtPush(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, _ := newLanderWorld(t)
		_, h1 := w.queuePull(1, "a.txt")
		moved := rig.CommitID("someone else pushed")
		w.git.MoveOnPush = moved
		w.serveUntilIdle(t)

		if w.git.Refused() != 1 {
			t.Errorf("%d pushes refused, want 1", w.git.Refused())
		}
		bs := w.queue.BatchList()
		var got []string
		for _, b := range bs {
			got = append(got, b.Status+" on "+b.Base)
		}
		if diff := cmp.Diff([]string{"rebuilt on " + rig.BaseCommit("main"), "landed on " + moved}, got); diff != "" {
			t.Fatalf("batches (-want +got):\n%s", diff)
		}
		if !strings.Contains(bs[0].Error, "moved") {
			t.Errorf("void batch's error %q", bs[0].Error)
		}
		if len(w.git.Pushes()) != 1 || !strings.HasPrefix(w.git.Pushes()[0], "main "+moved+" ") {
			t.Errorf("pushes %q, want one over the moved base", w.git.Pushes())
		}
		if w.git.Parent(w.git.Head("main")) != moved || !slices.Equal(w.git.Landed("main"), []string{h1}) {
			t.Error("main is not the pull squashed onto the moved base")
		}
		if len(w.queue.Landings()) != 1 {
			t.Errorf("landings %+v, want one", w.queue.Landings())
		}
	})
}

// The base branch moves while the batch's checks run: the lander sees
// it before pushing, voids the batch and lands a new one on the moved
// base; no push is even tried over the old one.
func TestLanderBaseMovedWhileTheBatchRuns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, s := newLanderWorld(t)
		_, h1 := w.queuePull(1, "a.txt")
		gate := make(chan struct{})
		w.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(w.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := w.serve(t)
		synctest.Wait()
		moved := rig.CommitID("someone else pushed")
		w.git.MoveHead("main", moved)
		close(gate)
		synctest.Wait()
		stop()

		var got []string
		for _, b := range w.queue.BatchList() {
			got = append(got, b.Status+" on "+b.Base)
		}
		if diff := cmp.Diff([]string{"rebuilt on " + rig.BaseCommit("main"), "landed on " + moved}, got); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		if w.git.Refused() != 0 || len(w.git.Pushes()) != 1 || !slices.Equal(w.git.Landed("main"), []string{h1}) {
			t.Errorf("refused %d, pushes %q, on main %q", w.git.Refused(), w.git.Pushes(), w.git.Landed("main"))
		}
	})
}

// A batch that failed before, whose bisection state.json lost, is not
// run again: the lander bisects it from its failed record at once (not
// at the next poll), ejects the culprit and lands the rest.
func TestLanderBisectsAgainAfterLosingItsMemory(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, s := newLanderWorld(t)
		_, h1 := w.queuePull(1, "a.txt")
		p2, h2 := w.queuePull(2, "b.txt")
		s.culprit = h2
		base := rig.BaseCommit("main")
		bp := []forge.BatchPull{{Pull: "at://did:plc:author/" + forge.CollectionPull + "/3p1", Commit: h1}, {Pull: p2, Commit: h2}}
		key := forge.BatchKey(rig.Repo, base, bp)
		w.queue.SetBatch(key, forge.Batch{Type: forge.CollectionBatch, Repo: rig.Repo, Ref: "refs/heads/main", Base: base, Pulls: bp,
			Squashed: rig.CommitID("lost"), Status: forge.BatchFailed, Error: "workflow batch: failure", CreatedAt: "2026-01-01T00:01:00.000Z"})
		stop := w.serve(t)
		synctest.Wait()
		stop()

		if diff := cmp.Diff([]string{h1}, w.git.Landed("main")); diff != "" {
			t.Errorf("pulls on main (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]string{p2: forge.EjectBatch}, w.queue.Reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
		var got []string
		for _, b := range w.queue.BatchList() {
			got = append(got, fmt.Sprintf("%s %d", b.Status, len(b.Pulls)))
		}
		if diff := cmp.Diff([]string{"failed 2", "landed 1", "failed 1"}, got); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
	})
}

// A pull whose head moves while its batch runs is not pushed: the batch
// is void and, with the pull ejected, the rest land.
func TestLanderHeadMovesDuringBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, s := newLanderWorld(t)
		_, h1 := w.queuePull(1, "a.txt")
		p2, _ := w.queuePull(2, "b.txt")
		gate := make(chan struct{})
		s.w.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(w.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch &&
				len(w.queue.Batch(uri.RecordKey().String()).Pulls) == 2 {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := w.serve(t)
		synctest.Wait()
		p := w.queue.GetPull(p2)
		p.Head.Commit = rig.CommitID("pushed again")
		w.queue.SetPull(p2, p)
		close(gate)
		synctest.Wait()
		stop()

		var got []string
		for _, b := range w.queue.BatchList() {
			got = append(got, fmt.Sprintf("%s %d", b.Status, len(b.Pulls)))
		}
		if diff := cmp.Diff([]string{"rebuilt 2", "landed 1"}, got); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]string{p2: forge.EjectHeadMoved}, w.queue.Reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
		if !slices.Equal(w.git.Landed("main"), []string{h1}) {
			t.Errorf("pulls on main %q", w.git.Landed("main"))
		}
	})
}

// A restart of the lander mid-batch, at either side of the push: the
// successor (same state directory, same source and records) finishes
// the batch; it lands once.
func TestLanderRestartMidBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// crash sets up the first process's end.
		crash func(w *world, s *queueScript) (cleanup func())
	}{
		{"while the batch runs", func(w *world, s *queueScript) func() {
			gate := make(chan struct{})
			w.exec.Script = func(runID, id string) fakeexec.Step {
				if uri := syntax.ATURI(w.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch {
					return fakeexec.Step{Gate: gate}
				}
				return s.step(runID, id)
			}
			return func() { close(gate) }
		}},
		{"after the push, before the landing", func(w *world, _ *queueScript) func() {
			w.queue.FailPut(forge.CollectionLanding, rig.ErrDown)
			return func() {
				w.queue.FailPut(forge.CollectionLanding, nil)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				w, s := newLanderWorld(t)
				_, h1 := w.queuePull(1, "a.txt")
				_, h2 := w.queuePull(2, "b.txt")
				cleanup := tc.crash(w, s)
				w.serveUntilIdle(t)
				if bs := w.queue.BatchList(); len(bs) != 1 || bs[0].Status != forge.BatchRunning {
					t.Fatalf("before the restart: batches %+v, want one running", bs)
				}
				cleanup()
				w.successor(t).serveUntilIdle(t)

				if diff := cmp.Diff([]string{h1, h2}, w.git.Landed("main")); diff != "" {
					t.Errorf("pulls on main (-want +got):\n%s", diff)
				}
				if len(w.git.Pushes()) != 1 || len(w.queue.Landings()) != 1 {
					t.Errorf("%d pushes and %d landings, want one of each", len(w.git.Pushes()), len(w.queue.Landings()))
				}
				if bs := w.queue.BatchList(); len(bs) != 1 || bs[0].Status != forge.BatchLanded {
					t.Errorf("batches %+v, want the one landed", bs)
				}
				if len(w.queue.Reasons()) != 0 {
					t.Errorf("ejections %v", w.queue.Reasons())
				}
			})
		})
	}
}

// A batch whose squashed commit left the cache (the mirror wiped) is
// squashed again from its record to the same commit, and lands.
func TestLanderResquashesAfterTheCacheIsWiped(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, s := newLanderWorld(t)
		_, h1 := w.queuePull(1, "a.txt")
		gate := make(chan struct{})
		w.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(w.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := w.serve(t)
		synctest.Wait()
		w.git.Wipe()
		close(gate)
		synctest.Wait()
		stop()
		if !slices.Equal(w.git.Landed("main"), []string{h1}) || len(w.queue.BatchList()) != 1 {
			t.Errorf("pulls on main %q, batches %+v", w.git.Landed("main"), w.queue.BatchList())
		}
	})
}

// The lander whose repository's landers do not name it (the fallback
// lander: the first runner, landers naming none of the runners) pushes
// nothing: every queued pull is ejected saying so, no pre-flight or
// batch runs.
func TestLanderNotAmongLandersEjects(t *testing.T) {
	t.Parallel()
	for _, landers := range [][]string{nil, {"did:plc:other"}} {
		t.Run(fmt.Sprintf("landers %q", landers), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				w, _ := newLanderWorld(t)
				w.lister.SetRepos(rig.QueueRepo([]string{rig.Runner}, landers))
				p1, h1 := w.queuePull(1, "a.txt")
				p2, _ := w.queuePull(2, "b.txt")
				w.serveUntilIdle(t)

				if len(w.git.Pushes()) != 0 || len(w.queue.BatchList()) != 0 || len(w.queue.Landings()) != 0 {
					t.Errorf("pushes %q, batches %+v, landings %+v; want none", w.git.Pushes(), w.queue.BatchList(), w.queue.Landings())
				}
				if diff := cmp.Diff(map[string]string{p1: forge.EjectNotLander, p2: forge.EjectNotLander}, w.queue.Reasons()); diff != "" {
					t.Errorf("ejections (-want +got):\n%s", diff)
				}
				if ej := w.queue.Ejection(p1); ej.Commit != h1 || !strings.Contains(ej.Detail, rig.Runner+") is not among the repository's landers") {
					t.Errorf("ejection %+v: want the approved commit and a detail naming this runner", ej)
				}
				if len(w.pds.Writes()) != 0 {
					t.Errorf("checks written (a pre-flight ran): %q", w.pds.Writes())
				}
			})
		})
	}
}

// The owner takes the lander out of landers while a batch runs: the
// batch is not pushed but void, and its pulls are ejected (notLander).
func TestLanderLosesItsGrantDuringBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, s := newLanderWorld(t)
		p1, _ := w.queuePull(1, "a.txt")
		gate := make(chan struct{})
		w.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(w.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := w.serve(t)
		synctest.Wait()
		w.lister.SetRepos(rig.QueueRepo([]string{rig.Runner}, nil))
		close(gate)
		synctest.Wait()
		stop()

		if len(w.git.Pushes()) != 0 || len(w.queue.Landings()) != 0 {
			t.Errorf("pushes %q, landings %+v; want none", w.git.Pushes(), w.queue.Landings())
		}
		if bs := w.queue.BatchList(); len(bs) != 1 || bs[0].Status != forge.BatchRebuilt || !strings.Contains(bs[0].Error, "no longer among the repository's landers") {
			t.Errorf("batches %+v, want the one void, saying why", bs)
		}
		if diff := cmp.Diff(map[string]string{p1: forge.EjectNotLander}, w.queue.Reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
	})
}

// The author retargets a queued pull while its batch runs: the batch is
// void, not pushed onto either branch; the pull is ejected (baseChanged)
// and the rest land on the approved base.
func TestLanderBaseChangesDuringBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, s := newLanderWorld(t)
		_, h1 := w.queuePull(1, "a.txt")
		p2, _ := w.queuePull(2, "b.txt")
		gate := make(chan struct{})
		w.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(w.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch &&
				len(w.queue.Batch(uri.RecordKey().String()).Pulls) == 2 {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := w.serve(t)
		synctest.Wait()
		p := w.queue.GetPull(p2)
		p.Base = "release"
		w.queue.SetPull(p2, p)
		close(gate)
		synctest.Wait()
		stop()

		var got []string
		for _, b := range w.queue.BatchList() {
			got = append(got, fmt.Sprintf("%s %d %s", b.Status, len(b.Pulls), b.Ref))
		}
		if diff := cmp.Diff([]string{"rebuilt 2 refs/heads/main", "landed 1 refs/heads/main"}, got); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]string{p2: forge.EjectBaseChanged}, w.queue.Reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
		if !slices.Equal(w.git.Landed("main"), []string{h1}) || len(w.git.Landed("release")) != 0 {
			t.Errorf("pulls on main %q, on release %q", w.git.Landed("main"), w.git.Landed("release"))
		}
	})
}

// A runner that is named but not the lander leaves the queue alone: no
// pre-flight, no record, no push.
func TestNotTheLanderDoesNothing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, _ := newLanderWorld(t)
		w.lister.SetRepos(rig.QueueRepo([]string{"did:plc:other", rig.Runner}, []string{"did:plc:other", rig.Runner}))
		w.queuePull(1, "a.txt")
		w.serveUntilIdle(t)
		if len(w.queue.Puts()) != 0 || len(w.git.Pushes()) != 0 {
			t.Errorf("records written %q, pushes %q", w.queue.Puts(), w.git.Pushes())
		}
		if len(w.pds.Writes()) != 0 {
			t.Errorf("checks written: %q", w.pds.Writes())
		}
	})
}

// Config.QueueBatch bounds a batch: three ready pulls with a bound of two
// land as a batch of the first two, then one of the third, in queue order.
func TestLanderBatchBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, _ := newLanderWorld(t)
		w.cfg.Batch = 2
		w.build(t)
		p1, h1 := w.queuePull(1, "a.txt")
		p2, h2 := w.queuePull(2, "b.txt")
		p3, h3 := w.queuePull(3, "c.txt")
		w.serveUntilIdle(t)

		if diff := cmp.Diff([]string{h1, h2, h3}, w.git.Landed("main")); diff != "" {
			t.Errorf("pulls on main (-want +got):\n%s", diff)
		}
		bs := w.queue.BatchList()
		slices.SortFunc(bs, func(a, b forge.Batch) int { return len(b.Pulls) - len(a.Pulls) })
		if len(bs) != 2 || !slices.Equal(batchPulls(bs[0]), []string{p1, p2}) || !slices.Equal(batchPulls(bs[1]), []string{p3}) {
			t.Fatalf("batches %+v, want pulls 1 and 2, then 3", bs)
		}
		for _, b := range bs {
			if b.Status != forge.BatchLanded {
				t.Errorf("batch of %v: %s, want landed", batchPulls(b), b.Status)
			}
		}
		if len(w.git.Pushes()) != 2 {
			t.Errorf("pushes %q, want two", w.git.Pushes())
		}
	})
}

// Offer never blocks: a listing the lander has not taken yet is
// replaced by the newer one.
func TestOfferNewestWins(t *testing.T) {
	t.Parallel()
	l := New(Config{Queue: true}, rig.Runner, Ports{}, nil)
	older, newer := &ingest.Snapshot{Hosts: []string{"older"}}, &ingest.Snapshot{Hosts: []string{"newer"}}
	l.Offer(older)
	l.Offer(newer) // must not block
	if got := <-l.offers; got != newer {
		t.Errorf("the lander takes %v, want the newest listing", got.Hosts)
	}
}

// A repository whose push does not end holds no other repository's
// queue: each repository the runner lands goes on in a goroutine of its
// own.
func TestSlowPushHoldsNoOtherRepository(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, _ := newLanderWorld(t)
		other := rig.OtherRepo("other")
		other.Value.Runners, other.Value.Landers = []string{rig.Runner}, []string{rig.Runner}
		w.lister.SetRepos(rig.QueueRepo([]string{rig.Runner}, []string{rig.Runner}), other)
		gate, pushing := make(chan struct{}), make(chan struct{})
		w.git.Lock()
		w.git.PushGate, w.git.PushGateSource, w.git.Pushing = gate, rig.Source, pushing
		w.git.Unlock()
		_, h1 := w.queuePull(1, "a.txt")
		_, h2 := w.queue.QueuePullTo(w.git, other, "release", 2, "b.txt")
		stop := w.serve(t)
		<-pushing // the rig repository's push waits on its source
		synctest.Wait()
		if got := w.git.Landed("release"); !slices.Equal(got, []string{h2}) {
			t.Errorf("the other repository while the first one pushes: landed %q, want its pull", got)
		}
		close(gate)
		synctest.Wait()
		stop()
		if got := w.git.Landed("main"); !slices.Equal(got, []string{h1}) {
			t.Errorf("the rig repository after its push: landed %q", got)
		}
	})
}

// observer records what the lander did.
type observer struct {
	mu sync.Mutex
	s  []string
}

func (o *observer) Ejected(_, reason string) {
	o.mu.Lock()
	o.s = append(o.s, "ejected "+reason)
	o.mu.Unlock()
}
func (o *observer) Landed(_ string, n int) {
	o.mu.Lock()
	o.s = append(o.s, fmt.Sprintf("landed %d", n))
	o.mu.Unlock()
}

// The observer is told of each ejection and landing.
func TestLanderObserver(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, s := newLanderWorld(t)
		obs := &observer{}
		w.l.p.Observer = obs
		uri, _ := w.queuePull(1, "a.txt")
		w.queuePull(2, "b.txt")
		s.failPre[uri] = true
		w.serveUntilIdle(t)
		if diff := cmp.Diff([]string{"ejected " + forge.EjectPreflight, "landed 1"}, obs.s); diff != "" {
			t.Errorf("observed (-want +got):\n%s", diff)
		}
	})
}
