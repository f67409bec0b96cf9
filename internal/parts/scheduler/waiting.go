package scheduler

// Waiting reports whether a job of check key is queued and no worker
// has taken it yet (or its queued check is being written): intake skips
// a schedule's tick while the workflow's previous tick still waits.
func (s *Scheduler) Waiting(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.q.reserved[key] {
		return true
	}
	for _, t := range s.q.waiting {
		if t.Key == key {
			return true
		}
	}
	return false
}
