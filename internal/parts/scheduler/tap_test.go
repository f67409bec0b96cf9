package scheduler

import (
	"bytes"
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/parts/rig"
)

// Live output across a handover: the tap is opened before the running
// check is written (so the check can say where its output is read); the
// detached run's end is told with its handover; the successor's tap is
// opened with the log handed over and its size, and what the two taps
// got, one after the other, is the final log, every byte once.
func TestTapAcrossAHandover(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		tp := &tap{logs: map[string]*bytes.Buffer{}, checks: w.pds.Statuses}
		w.ports.Tap = tp
		w.s = New(w.cfg, w.facts, w.ports, nil)
		gate := make(chan struct{})
		w.exec.Script = func(_, id string) fakeexec.Step {
			if id == "1" {
				return fakeexec.Step{Output: "before the handover\n", Gate: gate}
			}
			return fakeexec.Step{Output: "after\n"}
		}
		j := w.runnable(rig.Push("3k1", "c1"), "ci", "make", "make test")
		w.git.SetWorkflows(j.Workflow)
		stop := w.work(t, w.s)
		if _, err := w.s.Enqueue(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		stop()
		first := tp.logs[j.Key].String()
		if len(tp.ended) != 0 {
			t.Fatalf("the run handed over was told ended: %+v", tp.ended)
		}
		handed, _ := w.store.Run(j.Key)
		runID := handed.RunID
		if handed.Handover == nil || handed.Handover.LogSize != int64(len(first)) {
			t.Fatalf("handed over %+v; the tap had %d bytes", handed.Handover, len(first))
		}

		next := w.again(t)
		if n := next.Adopt(t.Context()); n != 1 {
			t.Fatalf("adopted %d runs, want 1", n)
		}
		close(gate)
		stop = w.work(t, next)
		synctest.Wait()
		stop()
		second := tp.logs[j.Key].String()
		want := []string{
			// A worker was free: no queued record; the tap is open
			// before the running one, which says where to read it.
			fmt.Sprintf("%s after [], prior \"\" at -1", runID),
			fmt.Sprintf("%s after [running], prior %q at %d", runID, first, len(first)),
		}
		if diff := cmp.Diff(want, tp.opened); diff != "" {
			t.Errorf("opened (-want +got):\n%s", diff)
		}
		if len(tp.ended) != 1 || tp.ended[0].Status != run.Success {
			t.Fatalf("the adopted run's end: %+v", tp.ended)
		}
		if got := first + second; got != string(tp.ended[0].Log) {
			t.Errorf("the taps got %q then %q; the final log is %q", first, second, tp.ended[0].Log)
		}
	})
}
