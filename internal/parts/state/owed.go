package state

import (
	"encoding/json"
	"time"
)

// Owed is a final check that could not be written to the PDS: its work
// is done and never runs again; the daemon writes the record when the
// PDS takes it, at restart too.
type Owed struct {
	// Check is the record to write (opaque here).
	Check json.RawMessage `json:"check"`
	// Event is the work's key (AT-URI@commit), marked done once written.
	Event string    `json:"event"`
	Since time.Time `json:"since"`
	Tries int       `json:"tries"`
	// LastError is why the last write failed.
	LastError string `json:"lastError,omitempty"`
}

// Prune forgets what is final and older than cutoff: done events whose
// key is not in keep (work still listed that needs its memory), and
// nothing that is owed or going on. It returns how many entries went.
func (s *State) Prune(cutoff time.Time, keep func(eventKey string) bool) int {
	n := 0
	for k, at := range s.Done {
		if at.Before(cutoff) && (keep == nil || !keep(k)) {
			delete(s.Done, k)
			n++
		}
	}
	return n
}
