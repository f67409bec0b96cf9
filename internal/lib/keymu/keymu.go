// Package keymu is a mutex per key (a check's key, a repository), kept
// only while someone holds or waits for it: the parts that serialise
// work on one key and let other keys go on share it.
package keymu

import "sync"

// Map is a mutex per key. The zero Map is ready to use.
type Map struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	sync.Mutex
	refs int
}

// Lock locks key's mutex and returns its unlock.
func (m *Map) Lock(key string) (unlock func()) {
	m.mu.Lock()
	if m.locks == nil {
		m.locks = map[string]*entry{}
	}
	l, ok := m.locks[key]
	if !ok {
		l = &entry{}
		m.locks[key] = l
	}
	l.refs++
	m.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.locks, key)
		}
		m.mu.Unlock()
	}
}

// held is how many keys have a holder or a waiter (for tests).
func (m *Map) held() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.locks)
}
