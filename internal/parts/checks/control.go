package checks

import "knotless.dev/run/internal/forge"

// Work lists the checks known of the work of subject s: every attempt
// of every workflow of the same event and commit (or tick), in no
// order. A re-run is planned against them (control.PlanRerun): the
// attempts taken, and those a record has caused already.
func (k *Keeper) Work(s forge.Subject) []forge.Check {
	return k.rec.matching(func(c forge.Check) bool {
		t := c.Subject
		return t.Kind == s.Kind && t.Event == s.Event && t.Commit == s.Commit && t.Repo == s.Repo && t.Tick == s.Tick
	})
}

// matching returns the checks known for which keep is true.
func (r *Recorder) matching(keep func(forge.Check) bool) []forge.Check {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []forge.Check
	for _, c := range r.known {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// Unfinished lists, by key, the checks known that are not final: the
// work an earlier process (or a stopping one) left queued or running.
func (k *Keeper) Unfinished() map[string]forge.Check {
	k.rec.mu.Lock()
	defer k.rec.mu.Unlock()
	out := map[string]forge.Check{}
	for key, c := range k.rec.known {
		if !Status(c.Status).Final() {
			out[key] = c
		}
	}
	return out
}
