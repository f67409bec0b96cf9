package ingest

import (
	"sync"
	"time"
)

// backoffs isolates the PDSes (or accounts) a reconcile lists from one
// another: one that fails, or answers past its deadline, is left out of
// the reconciles for a backoff, so it never stops the others' work. It
// is safe for concurrent use: a reconcile lists in parallel (bounds.go).
type backoffs struct {
	mu   sync.Mutex
	keys map[string]*backoffState
	// answered are the keys whose last try succeeded.
	answered map[string]bool
}

type backoffState struct {
	failures int
	next     time.Time
}

// Backoff bounds of a failing host or account.
const (
	hostBackoff    = 5 * time.Second
	hostBackoffMax = 5 * time.Minute
)

// skip reports whether key is still backing off.
func (b *backoffs) skip(key string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.keys[key]
	return ok && now.Before(s.next)
}

// failed starts or lengthens key's backoff: 5 s, doubling up to 5 min.
// It returns how many times in a row key failed and the wait.
func (b *backoffs) failed(key string, now time.Time) (failures int, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.keys == nil {
		b.keys = map[string]*backoffState{}
	}
	delete(b.answered, key)
	s, ok := b.keys[key]
	if !ok {
		s = &backoffState{}
		b.keys[key] = s
	}
	s.failures++
	wait = hostBackoff
	for i := 1; i < s.failures && wait < hostBackoffMax; i++ {
		wait *= 2
	}
	wait = min(wait, hostBackoffMax)
	s.next = now.Add(wait)
	return s.failures, wait
}

// ok ends key's backoff; it returns how many times it had failed (0:
// it was not backing off).
func (b *backoffs) ok(key string) (failures int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.answered == nil {
		b.answered = map[string]bool{}
	}
	b.answered[key] = true
	if s, found := b.keys[key]; found {
		delete(b.keys, key)
		return s.failures
	}
	return 0
}

// hasAnswered reports whether key's last try succeeded (ok, and no
// failure since).
func (b *backoffs) hasAnswered(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.answered[key]
}
