package state

import "time"

// ScheduleLast is the newest tick of the schedule of workflow wf of the
// repository repo (an AT-URI) already run, or when the runner first saw
// that schedule; the zero time when it never did.
func (s *Store) ScheduleLast(repo, wf string) (last time.Time) {
	s.read(func(st *State) { last = st.Schedules[repo][wf] })
	return last
}

// SetScheduleLast records t as the newest tick of the schedule of
// workflow wf of repo run (or first seen); it is on disk when it
// returns. A time older than the one recorded changes nothing: a tick
// is never run twice.
func (s *Store) SetScheduleLast(repo, wf string, t time.Time) error {
	t = t.UTC()
	return s.change(func(st *State) bool {
		if prev := st.Schedules[repo][wf]; !t.After(prev) {
			return false
		}
		if st.Schedules == nil {
			st.Schedules = map[string]map[string]time.Time{}
		}
		if st.Schedules[repo] == nil {
			st.Schedules[repo] = map[string]time.Time{}
		}
		st.Schedules[repo][wf] = t
		return true
	})
}
