package intake

import (
	"container/list"
	"sync"
)

// DefaultRemembered is how many things intake remembers having said or
// done once (onceSet): refused run-control records, the records acted
// on, the workflow warnings logged.
const DefaultRemembered = 10_000

// onceSet remembers what was logged or done once, so that a record
// listed at every reconcile is not logged (or acted on) at every one:
// at most max keys, the one least recently looked at forgotten first.
// Anyone can write records a reconcile lists (a stranger's cancels and
// re-runs, a pull's workflow files), so the memory is bounded: past
// max, a record that is still listed is logged again, at most once
// per reconcile for each key forgotten, and nothing grows. It has its
// own lock, taken for no I/O.
type onceSet struct {
	max int

	mu    sync.Mutex
	order list.List // of keys, the most recently looked at first
	at    map[string]*list.Element
}

func newOnceSet(max int) *onceSet {
	if max <= 0 {
		max = DefaultRemembered
	}
	s := &onceSet{max: max, at: map[string]*list.Element{}}
	s.order.Init()
	return s
}

// first reports whether key is new (or was forgotten), and remembers
// it.
func (s *onceSet) first(key string) bool {
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

// seen reports whether key is remembered, without remembering it.
func (s *onceSet) seen(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seenLocked(key)
}

func (s *onceSet) seenLocked(key string) bool {
	e, ok := s.at[key]
	if ok {
		s.order.MoveToFront(e)
	}
	return ok
}

// len is how many keys are remembered.
func (s *onceSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}
