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

// KeepSchedules forgets the schedules of repository repo but those of
// the workflows named in scheduled: the workflows scheduled at the head
// of its default branch, as last read. It returns how many it forgot.
// A workflow scheduled again later is new: its first tick is the next
// one after it is seen.
func (s *Store) KeepSchedules(repo string, scheduled []string) (n int, err error) {
	keep := make(map[string]bool, len(scheduled))
	for _, wf := range scheduled {
		keep[wf] = true
	}
	err = s.change(func(st *State) bool {
		for wf := range st.Schedules[repo] {
			if !keep[wf] {
				delete(st.Schedules[repo], wf)
				n++
			}
		}
		if st.Schedules[repo] != nil && len(st.Schedules[repo]) == 0 {
			delete(st.Schedules, repo)
		}
		return n > 0
	})
	return n, err
}

// KeepScheduleRepos forgets the schedules of every repository but those
// in served, the repositories a complete listing found: the caller
// never passes a listing that failed in part, which would forget the
// schedules of a repository whose owner's PDS is down. It returns how
// many repositories' schedules it forgot.
func (s *Store) KeepScheduleRepos(served []string) (n int, err error) {
	keep := make(map[string]bool, len(served))
	for _, r := range served {
		keep[r] = true
	}
	err = s.change(func(st *State) bool {
		for repo := range st.Schedules {
			if !keep[repo] {
				delete(st.Schedules, repo)
				n++
			}
		}
		return n > 0
	})
	return n, err
}
