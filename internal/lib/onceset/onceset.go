// Package onceset is a bounded memory of what was logged or done once,
// so that a record listed at every reconcile is not logged (or acted
// on) at every one. Intake keeps the workflow warnings it logged in
// one, run control the records it refused or acted on in another.
package onceset

import (
	"container/list"
	"sync"
)

// DefaultMax is how many keys a Set remembers when New is given none.
const DefaultMax = 10_000

// Set remembers at most max keys, the one least recently looked at
// forgotten first. Anyone can write records a reconcile lists (a
// stranger's cancels and re-runs, a pull's workflow files), so the
// memory is bounded: past max, a record that is still listed is logged
// again, at most once per reconcile for each key forgotten, and nothing
// grows. It has its own lock, taken for no I/O.
type Set struct {
	max int

	mu    sync.Mutex
	order list.List // of keys, the most recently looked at first
	at    map[string]*list.Element
}

// New returns a Set of at most max keys (0 or less: DefaultMax).
func New(max int) *Set {
	if max <= 0 {
		max = DefaultMax
	}
	s := &Set{max: max, at: map[string]*list.Element{}}
	s.order.Init()
	return s
}

// First reports whether key is new (or was forgotten), and remembers
// it.
func (s *Set) First(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seenLocked(key) {
		return false
	}
	s.at[key] = s.order.PushFront(key)
	for len(s.at) > s.max {
		oldest := s.order.Back()
		delete(s.at, oldest.Value.(string))
		s.order.Remove(oldest)
	}
	return true
}

// Seen reports whether key is remembered, without remembering it.
func (s *Set) Seen(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seenLocked(key)
}

func (s *Set) seenLocked(key string) bool {
	e, ok := s.at[key]
	if ok {
		s.order.MoveToFront(e)
	}
	return ok
}

// Len is how many keys are remembered.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}
