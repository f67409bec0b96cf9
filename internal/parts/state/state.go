// Package state is the daemon's state directory: state.json (the
// session, cursors, the runs going on and what an executor needs to
// reattach to them), secrets-key.json (the sealing key pair) and lock
// (held by the one live process that owns the directory). Each data file
// is written atomically (temp file, fsync, rename) with mode 0600; a
// corrupt file or one of an unknown version stops the start with an error
// naming it and is never overwritten.
package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/atomicfile"
)

// Version is the state.json format this build reads and writes.
const Version = 1

// File names inside the state directory.
const (
	StateFile = "state.json"
	KeyFile   = "secrets-key.json"
)

// State is the content of state.json.
type State struct {
	Version int `json:"version"`
	// Session is the runner's PDS session (refresh token included).
	Session *forge.Session `json:"session,omitempty"`
	// Cursors are the last event sequence numbers seen, by event source.
	Cursors map[string]int64 `json:"cursors,omitempty"`
	// Repos are the repositories seen, by AT-URI, with when first seen.
	Repos map[string]time.Time `json:"repos,omitempty"`
	// Done are the events (AT-URI and commit) whose every check is final.
	Done map[string]time.Time `json:"done,omitempty"`
	// Runs are the runs going on (started, or handed over by a stopped
	// process), by check key.
	Runs map[string]Run `json:"runs,omitempty"`
	// Owed are final checks the PDS has not taken yet, by check key.
	Owed map[string]Owed `json:"owed,omitempty"`
	// Lander is the merge queue's memory the records do not hold (a
	// bisection), by repository AT-URI; opaque here.
	Lander map[string]json.RawMessage `json:"lander,omitempty"`
	// Schedules are, by repository AT-URI and workflow, the newest tick
	// of its schedule run (or when the runner first saw the schedule):
	// schedule.go.
	Schedules map[string]map[string]time.Time `json:"schedules,omitempty"`
}

// Run is one run that was started and has no final check yet.
type Run struct {
	CheckKey string `json:"check"`
	RunID    string `json:"run"`
	Workflow string `json:"workflow"`
	// Event and Commit identify the work (the refUpdate or pull).
	Event  string `json:"event"`
	Commit string `json:"commit"`
	// Job is the daemon's own description of the work, enough to pick
	// the run up again without listing (opaque here).
	Job json.RawMessage `json:"job,omitempty"`
	// Handover is set when a stopping process left the run going for its
	// successor to adopt; its log is in the cache beside the run.
	Handover  *run.Handover `json:"handover,omitempty"`
	StartedAt time.Time     `json:"startedAt"`
}

// New returns an empty state.
func New() *State { return &State{Version: Version} }

// Load reads state.json from dir; a missing file is an empty state.
func Load(dir string) (*State, error) {
	name := filepath.Join(dir, StateFile)
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state %s: %w", name, err)
	}
	var probe struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("state file %s is corrupt (%v); move it away to start afresh (runs it recorded are then swept)", name, err)
	}
	if probe.Version == nil || *probe.Version != Version {
		v := "none"
		if probe.Version != nil {
			v = fmt.Sprint(*probe.Version)
		}
		return nil, fmt.Errorf("state file %s has version %s; this knotless-run reads version %d only", name, v, Version)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	s := New()
	if err := dec.Decode(s); err != nil {
		return nil, fmt.Errorf("state file %s is corrupt (%v); move it away to start afresh", name, err)
	}
	return s, nil
}

// Save writes s to dir/state.json atomically.
func (s *State) Save(dir string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	return WriteFile(filepath.Join(dir, StateFile), append(b, '\n'))
}

// Clone returns a deep copy of s.
func (s *State) Clone() *State {
	b, _ := json.Marshal(s)
	c := New()
	_ = json.Unmarshal(b, c)
	return c
}

// RunIDs lists the run ids of the going runs, sorted.
func (s *State) RunIDs() []string {
	ids := make([]string, 0, len(s.Runs))
	for _, r := range s.Runs {
		ids = append(ids, r.RunID)
	}
	sort.Strings(ids)
	return ids
}

// WriteFile writes data to name atomically with mode 0600
// (atomicfile.Write: a temporary file in the same directory, fsync,
// rename, fsync of the directory).
func WriteFile(name string, data []byte) error {
	return atomicfile.Write(name, data, 0o600)
}
