package scheduler

import "knotless.dev/run/internal/engine/run"

// openLive opens t's live output (Tap.Open) before its running check is
// written, so the check can say where the output is read; an adopted
// run's stream starts with the log handed over.
func (s *Scheduler) openLive(t *task) {
	if s.p.Tap == nil {
		return
	}
	t.live, t.liveRun = s.p.Tap.Open(t.Job, t.runID, t.prior, t.adopt), t.runID
}

// endLive tells the tap how t's run ended, before its final check is
// written and its outputs directory removed (not for a run handed over
// or released: its stream goes on in a successor, or its work runs
// again there).
func (s *Scheduler) endLive(t *task, res *run.Result, outDir string) {
	if s.p.Tap == nil || t.live == nil {
		return
	}
	// One stream for every try of the work (retry.go): the first's.
	s.p.Tap.Ended(t.Job, t.liveRun, res, outDir)
}
