package daemon

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"

	"knotless.dev/run/internal/state"
)

// stateFile is the one writer of state.json. The daemon changes its
// state under its mutex and takes a snapshot there (snapshot: an
// encoding, no disk); the write, with its fsyncs, happens after the
// mutex is released (write), so a slow disk stalls no worker, cursor or
// status. Writes are serialized, and a snapshot older than one already
// written is skipped: the file only moves forward.
type stateFile struct {
	dir string
	gen uint64 // snapshots taken; guarded by the daemon's mutex

	mu      sync.Mutex // serializes the writes
	written uint64     // the newest snapshot written
}

// stateSnapshot is state.json's content at one moment.
type stateSnapshot struct {
	data []byte
	gen  uint64
	err  error
}

// snapshot encodes st; the caller holds the daemon's mutex.
func (f *stateFile) snapshot(st *state.State) stateSnapshot {
	f.gen++
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return stateSnapshot{gen: f.gen, err: fmt.Errorf("save state: encode: %w", err)}
	}
	return stateSnapshot{data: append(b, '\n'), gen: f.gen}
}

// write writes a snapshot unless a newer one is written already; the
// caller holds no lock of the daemon's.
func (f *stateFile) write(s stateSnapshot) error {
	if s.err != nil {
		return s.err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.gen <= f.written {
		return nil
	}
	if err := state.WriteFile(filepath.Join(f.dir, state.StateFile), s.data); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	f.written = s.gen
	return nil
}
