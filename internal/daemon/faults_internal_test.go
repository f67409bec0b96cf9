package daemon

import (
	"log/slog"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/state"
)

// TestOwnChecksDoNotWake: the runner's own check writes come back on
// the event stream; they must not wake the reconciler (one bad push once
// gave a reconcile per check write), while an owner's change does.
func TestOwnChecksDoNotWake(t *testing.T) {
	t.Parallel()
	runner := syntax.DID("did:plc:runner")
	owner := syntax.DID("did:plc:owner")
	tests := []struct {
		name string
		c    ingest.Change
		wake bool
	}{
		{"own check", ingest.Change{Host: "h", DID: runner, Collection: forge.CollectionCheck, Seq: 1}, false},
		{"owner push", ingest.Change{Host: "h", DID: owner, Collection: forge.CollectionRefUpdate, Seq: 2}, true},
		{"gap", ingest.Change{Host: "h", Gap: true}, true},
		{"other's check", ingest.Change{Host: "h", DID: owner, Collection: forge.CollectionCheck, Seq: 3}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := &Daemon{cfg: Config{Runner: runner}, wake: make(chan struct{}, 1), st: state.New(), log: slog.New(slog.DiscardHandler)}
			d.changed(tt.c)
			got := len(d.wake) == 1
			if got != tt.wake {
				t.Errorf("woke: %v, want %v", got, tt.wake)
			}
		})
	}
}
