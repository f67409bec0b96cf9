package scheduler

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"testing/synctest"

	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/rig"
)

const cancelRecord = "at://did:plc:owner/dev.knotless.cancel/k1"

// A check an earlier process left queued, not in hand here: CancelCheck
// writes it cancelled, naming the record, and no job of it can be
// queued while it does.
func TestCancelCheckNotInHand(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ev := rig.Push("3k1", "c1")
	j := w.runnable(ev, "ci", "make")
	w.keeper.Know(j.Key, forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: "ci", Status: "queued", CreatedAt: forge.Now()})
	if !w.s.CancelCheck(t.Context(), j.Key, cancelRecord, ev, mustGet(t, w, j.Key)) {
		t.Fatal("not cancelled")
	}
	c := mustGet(t, w, j.Key)
	if c.Status != "cancelled" || c.CancelledBy != cancelRecord || c.Error != "cancelled by "+cancelRecord {
		t.Errorf("check %s, cancelledBy %q, error %q", c.Status, c.CancelledBy, c.Error)
	}
	if w.s.HasCheck(j.Key) {
		t.Error("the key is still reserved")
	}
	// A final check is never queued again.
	if queued, err := w.s.Enqueue(t.Context(), j); queued || err == nil {
		t.Errorf("a cancelled check queued again: %v, %v", queued, err)
	}
	if got := w.pds.Statuses(j.Key); !slices.Equal(got, []string{"cancelled"}) {
		t.Errorf("writes %v, want one cancelled", got)
	}
}

// A replica leaves a check another process left running to that run's
// driver (it stops the run and writes the check when it sees the same
// record); one left queued it cancels, as one process does.
func TestReplicaCancelsOnlyWhatNoOneDrives(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.ports.Drivers = noDrivers{}
	w.s = New(w.cfg, w.facts, w.ports, nil)
	ev := rig.Push("3k1", "c1")
	j := w.runnable(ev, "ci", "make")
	w.keeper.Know(j.Key, forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: "ci", Status: "running", CreatedAt: forge.Now()})
	if w.s.CancelCheck(t.Context(), j.Key, cancelRecord, ev, mustGet(t, w, j.Key)) {
		t.Error("a replica acted on the cancel of a run another process drives")
	}
	if got := w.pds.Statuses(j.Key); len(got) != 0 {
		t.Errorf("a replica wrote %v over another's running check", got)
	}
	w.keeper.Know(j.Key, forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: "ci", Status: "queued", CreatedAt: forge.Now()})
	if !w.s.CancelCheck(t.Context(), j.Key, cancelRecord, ev, mustGet(t, w, j.Key)) || mustGet(t, w, j.Key).Status != "cancelled" {
		t.Errorf("a queued check no one drives: %s, want cancelled", mustGet(t, w, j.Key).Status)
	}
}

// A cancel that races the run's end leaves one final check, whichever
// wins, never two: the run's gate and the cancel go at once, many
// times, the cancel after more and more of the run's end (every fourth
// after its final check), decided on the check as read before.
func TestCancelRacesTheRunsEnd(t *testing.T) {
	t.Parallel()
	const rounds = 200
	won := map[string]int{}
	for i := range rounds {
		synctest.Test(t, func(t *testing.T) {
			w := newWorld(t)
			gate := make(chan struct{})
			w.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate, Output: "working\n"} }
			ev := rig.Push(fmt.Sprintf("3k%d", i), "c1")
			j := w.runnable(ev, "ci", "make")
			stop := w.work(t, w.s)
			if _, err := w.s.Enqueue(t.Context(), j); err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // running, at the step's gate
			c := mustGet(t, w, j.Key)
			done := make(chan bool)
			go func() { close(gate) }()
			if i%4 == 3 {
				synctest.Wait() // the run has ended: the cancel comes late
			}
			go func() {
				// The cancel was decided on the check as it was read (c,
				// running), and lands anywhere in the run's end.
				for range i % 4 {
					runtime.Gosched()
				}
				done <- w.s.CancelCheck(t.Context(), j.Key, cancelRecord, ev, c)
			}()
			<-done
			synctest.Wait()
			stop()
			var finals []string
			for _, s := range w.pds.Statuses(j.Key) {
				if s != "queued" && s != "running" {
					finals = append(finals, s)
				}
			}
			if len(finals) != 1 {
				t.Fatalf("round %d: final writes %v, want exactly one", i, finals)
			}
			won[finals[0]]++
			if got := mustGet(t, w, j.Key); got.Status == "cancelled" && got.CancelledBy != cancelRecord {
				t.Errorf("round %d: cancelled check names %q", i, got.CancelledBy)
			}
		})
	}
	t.Logf("of %d races: %v", rounds, won)
	for s := range won {
		if s != "success" && s != "cancelled" {
			t.Errorf("a race ended %s", s)
		}
	}
}

func mustGet(t *testing.T, w *world, key string) forge.Check {
	t.Helper()
	c, ok := w.keeper.Get(key)
	if !ok {
		t.Fatalf("no check %s", key)
	}
	return c
}
