package state

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
)

// Store is the daemon's state and the one writer of state.json: the
// only way to read or change the state. Each method that changes it
// locks, changes, takes a snapshot (an encoding, no disk) and unlocks;
// the write, with its fsyncs, happens after the unlock, so a slow disk
// stalls no worker, cursor or status. Writes are serialized, and a
// snapshot older than one already written is skipped: the file only
// moves forward. Reads return copies.
type Store struct {
	dir string

	mu  sync.Mutex
	st  *State
	gen uint64 // snapshots taken
	// cursorsDirty says the cursors moved since they were last written
	// (SetCursor changes them without a write; SaveCursors writes).
	cursorsDirty bool

	wmu     sync.Mutex // serializes the writes
	written uint64     // the newest snapshot written
}

// Open loads state.json from dir (Load) into a Store.
func Open(dir string) (*Store, error) {
	st, err := Load(dir)
	if err != nil {
		return nil, err
	}
	return &Store{dir: dir, st: st}, nil
}

// snapshot is state.json's content at one moment.
type snapshot struct {
	data []byte
	gen  uint64
	err  error
}

// change runs f on the state under the lock and writes the result after
// the unlock; f returns false when it changed nothing (no write).
func (s *Store) change(f func(st *State) bool) error {
	s.mu.Lock()
	if !f(s.st) {
		s.mu.Unlock()
		return nil
	}
	snap := s.snapshotLocked()
	s.mu.Unlock()
	return s.write(snap)
}

// snapshotLocked encodes the state; the caller holds s.mu.
func (s *Store) snapshotLocked() snapshot {
	s.gen++
	b, err := json.MarshalIndent(s.st, "", "  ")
	if err != nil {
		return snapshot{gen: s.gen, err: fmt.Errorf("save state: encode: %w", err)}
	}
	return snapshot{data: append(b, '\n'), gen: s.gen}
}

// write writes a snapshot unless a newer one is written already; the
// caller holds no lock.
func (s *Store) write(snap snapshot) error {
	if snap.err != nil {
		return snap.err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if snap.gen <= s.written {
		return nil
	}
	if err := WriteFile(filepath.Join(s.dir, StateFile), snap.data); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	s.written = snap.gen
	return nil
}

// read runs f on the state under the lock.
func (s *Store) read(f func(st *State)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.st)
}

// Save writes the state as it is.
func (s *Store) Save() error { return s.change(func(*State) bool { return true }) }

// Session returns the saved PDS session, or nil.
func (s *Store) Session() *forge.Session {
	var out *forge.Session
	s.read(func(st *State) {
		if st.Session != nil {
			c := *st.Session
			out = &c
		}
	})
	return out
}

// SetSession saves the PDS session (every refresh).
func (s *Store) SetSession(sess forge.Session) error {
	return s.change(func(st *State) bool {
		st.Session = &sess
		return true
	})
}

// Done reports whether every check of the event (its key) is final.
func (s *Store) Done(evKey string) (done bool) {
	s.read(func(st *State) { _, done = st.Done[evKey] })
	return done
}

// MarkDone records that every check of the event is final.
func (s *Store) MarkDone(evKey string) error {
	return s.change(func(st *State) bool {
		if st.Done == nil {
			st.Done = map[string]time.Time{}
		}
		st.Done[evKey] = time.Now().UTC()
		return true
	})
}

// NoteRepos records the repositories seen for the first time, and the
// events history returns for each of them as done (older pushes are
// history, not work). history is called under the store's lock: it
// must not call the store. It returns how many events each repository
// noted now had as history.
func (s *Store) NoteRepos(uris []string, history func(uri string) []string) (noted map[string]int, err error) {
	err = s.change(func(st *State) bool {
		now := time.Now().UTC()
		for _, uri := range uris {
			if _, seen := st.Repos[uri]; seen {
				continue
			}
			if st.Repos == nil {
				st.Repos = map[string]time.Time{}
			}
			if st.Done == nil {
				st.Done = map[string]time.Time{}
			}
			st.Repos[uri] = now
			if noted == nil {
				noted = map[string]int{}
			}
			keys := history(uri)
			for _, k := range keys {
				st.Done[k] = now
			}
			noted[uri] = len(keys)
		}
		return len(noted) > 0
	})
	return noted, err
}

// Run returns the going run of a check key.
func (s *Store) Run(key string) (r Run, ok bool) {
	s.read(func(st *State) { r, ok = st.Runs[key] })
	return r, ok
}

// Runs returns the going runs by check key (a copy).
func (s *Store) Runs() (runs map[string]Run) {
	s.read(func(st *State) { runs = maps.Clone(st.Runs) })
	if runs == nil {
		runs = map[string]Run{}
	}
	return runs
}

// RunIDs lists the run ids of the going runs, sorted.
func (s *Store) RunIDs() (ids []string) {
	s.read(func(st *State) { ids = st.RunIDs() })
	return ids
}

// StartRun records a run as it starts: on disk before the run starts.
func (s *Store) StartRun(key string, r Run) error {
	return s.change(func(st *State) bool {
		if st.Runs == nil {
			st.Runs = map[string]Run{}
		}
		st.Runs[key] = r
		return true
	})
}

// DetachRun records where a detached run stopped, for the successor.
func (s *Store) DetachRun(key string, h *run.Handover) error {
	var missing bool
	err := s.change(func(st *State) bool {
		r, ok := st.Runs[key]
		if !ok {
			missing = true
			return false
		}
		r.Handover = h
		st.Runs[key] = r
		return true
	})
	if missing {
		return fmt.Errorf("run of check %s is not in state.json", key)
	}
	return err
}

// EndRun forgets a run that ended.
func (s *Store) EndRun(key string) error {
	return s.change(func(st *State) bool {
		delete(st.Runs, key)
		return true
	})
}

// ClaimHandovers takes the handovers of the runs of keys out of the
// state: a handover is good once (a process adopting them takes them).
func (s *Store) ClaimHandovers(keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	return s.change(func(st *State) bool {
		for _, k := range keys {
			if r, ok := st.Runs[k]; ok {
				r.Handover = nil
				st.Runs[k] = r
			}
		}
		return true
	})
}

// KeepRuns forgets every going run but those of keys (the sweep) and
// returns how many went; nothing is written when none went.
func (s *Store) KeepRuns(keys []string) (dropped int, err error) {
	err = s.change(func(st *State) bool {
		kept := map[string]Run{}
		for _, k := range keys {
			if r, ok := st.Runs[k]; ok {
				kept[k] = r
			}
		}
		dropped = len(st.Runs) - len(kept)
		if dropped == 0 {
			return false
		}
		st.Runs = kept
		return true
	})
	return dropped, err
}

// Cursor is the last event sequence number seen from host.
func (s *Store) Cursor(host string) (seq int64) {
	s.read(func(st *State) { seq = st.Cursors[host] })
	return seq
}

// SetCursor moves host's cursor without writing (SaveCursors writes).
func (s *Store) SetCursor(host string, seq int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Cursors == nil {
		s.st.Cursors = map[string]int64{}
	}
	s.st.Cursors[host] = seq
	s.cursorsDirty = true
}

// SaveCursors writes the state when a cursor moved since the last time.
func (s *Store) SaveCursors() error {
	return s.change(func(*State) bool {
		dirty := s.cursorsDirty
		s.cursorsDirty = false
		return dirty
	})
}

// Owe keeps (or updates) a final check the PDS has not taken.
func (s *Store) Owe(key string, o Owed) error {
	return s.change(func(st *State) bool {
		if st.Owed == nil {
			st.Owed = map[string]Owed{}
		}
		st.Owed[key] = o
		return true
	})
}

// Paid forgets an owed check the PDS took, and marks its event done.
func (s *Store) Paid(key string) error {
	return s.change(func(st *State) bool {
		o, ok := st.Owed[key]
		delete(st.Owed, key)
		if ok && o.Event != "" {
			if st.Done == nil {
				st.Done = map[string]time.Time{}
			}
			st.Done[o.Event] = time.Now().UTC()
		}
		return true
	})
}

// Forgive forgets an owed check without marking its event done (one
// that cannot be written at all).
func (s *Store) Forgive(key string) error {
	return s.change(func(st *State) bool {
		_, ok := st.Owed[key]
		delete(st.Owed, key)
		return ok
	})
}

// Owed returns the owed checks by check key (a copy).
func (s *Store) Owed() (owed map[string]Owed) {
	s.read(func(st *State) { owed = maps.Clone(st.Owed) })
	if owed == nil {
		owed = map[string]Owed{}
	}
	return owed
}

// IsOwed reports whether the check of key is owed.
func (s *Store) IsOwed(key string) (owed bool) {
	s.read(func(st *State) { _, owed = st.Owed[key] })
	return owed
}

// Prune forgets the done events older than cutoff whose key keep does
// not keep (State.Prune) and returns how many went.
func (s *Store) Prune(cutoff time.Time, keep func(evKey string) bool) (n int, err error) {
	err = s.change(func(st *State) bool {
		n = st.Prune(cutoff, keep)
		return n > 0
	})
	return n, err
}

// Lander is the merge queue's memory of a repository (opaque), or nil.
func (s *Store) Lander(repo string) (raw json.RawMessage) {
	s.read(func(st *State) { raw = append(json.RawMessage(nil), st.Lander[repo]...) })
	if len(raw) == 0 {
		return nil
	}
	return raw
}

// SetLander keeps the merge queue's memory of a repository.
func (s *Store) SetLander(repo string, raw json.RawMessage) error {
	return s.change(func(st *State) bool {
		if st.Lander == nil {
			st.Lander = map[string]json.RawMessage{}
		}
		st.Lander[repo] = raw
		return true
	})
}

// Snapshot returns a copy of the whole state (for tests and status).
func (s *Store) Snapshot() (c *State) {
	s.read(func(st *State) { c = st.Clone() })
	return c
}

// DoneKeys lists the done events' keys, sorted.
func (s *Store) DoneKeys() (keys []string) {
	s.read(func(st *State) {
		for k := range st.Done {
			keys = append(keys, k)
		}
	})
	sort.Strings(keys)
	return keys
}
