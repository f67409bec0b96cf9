package daemon

import (
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
			d := &Daemon{cfg: Config{Runner: runner}, wake: make(chan struct{}, 1), st: state.New(), log: slog.New(slog.DiscardHandler), lister: &ingest.Lister{}}
			d.changed(tt.c)
			got := len(d.wake) == 1
			if got != tt.wake {
				t.Errorf("woke: %v, want %v", got, tt.wake)
			}
		})
	}
}

// TestPrune: final work older than the retention is forgotten, from
// state.json and from the checks kept in memory; what is still listed
// work, owed, not final or recent stays.
func TestPrune(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	cutoff := now.Add(-30 * 24 * time.Hour)
	old, recent := now.Add(-40*24*time.Hour), now.Add(-time.Hour)
	ts := func(t time.Time) string { return t.Format(time.RFC3339Nano) }
	check := func(status string, ev string, finished time.Time) forge.Check {
		return forge.Check{Status: status, Subject: forge.Subject{Event: ev, Commit: "c"}, CreatedAt: ts(finished), FinishedAt: ts(finished)}
	}
	st := state.New()
	st.Done = map[string]time.Time{"old@c": old, "listed@c": old, "recent@c": recent}
	st.Owed = map[string]state.Owed{"owed": {}}
	checks := map[string]forge.Check{
		"old":     check("success", "old", old),
		"listed":  check("success", "listed", old),
		"running": check("running", "gone", old),
		"owed":    check("failure", "gone", old),
		"recent":  check("success", "recent", recent),
	}
	forget := func(drop func(string, forge.Check) bool) int {
		n := 0
		for k, c := range checks {
			if drop(k, c) {
				delete(checks, k)
				n++
			}
		}
		return n
	}
	done, final := prune(st, forget, map[string]bool{"listed@c": true}, cutoff)
	if done != 1 || final != 1 {
		t.Errorf("pruned %d done and %d checks, want 1 and 1", done, final)
	}
	var gotDone, gotChecks []string
	for k := range st.Done {
		gotDone = append(gotDone, k)
	}
	for k := range checks {
		gotChecks = append(gotChecks, k)
	}
	sort.Strings(gotDone)
	sort.Strings(gotChecks)
	if diff := cmp.Diff(gotDone, []string{"listed@c", "recent@c"}); diff != "" {
		t.Errorf("done (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(gotChecks, []string{"listed", "owed", "recent", "running"}); diff != "" {
		t.Errorf("checks (-got +want):\n%s", diff)
	}
}

// TestPastRetention: a push older than the retention is never work; a
// pull is judged by its listing, not by its age.
func TestPastRetention(t *testing.T) {
	t.Parallel()
	now := time.Now()
	cutoff := now.Add(-30 * 24 * time.Hour)
	uri := func(coll string, at time.Time) syntax.ATURI {
		return syntax.ATURI("at://did:plc:owner/" + coll + "/" + syntax.NewTID(at.UnixMicro(), 0).String())
	}
	tests := []struct {
		name string
		ev   ingest.Event
		want bool
	}{
		{"old push", ingest.Event{Kind: forge.KindPush, URI: uri(forge.CollectionRefUpdate, now.Add(-40*24*time.Hour))}, true},
		{"new push", ingest.Event{Kind: forge.KindPush, URI: uri(forge.CollectionRefUpdate, now.Add(-time.Hour))}, false},
		{"old pull", ingest.Event{Kind: forge.KindPull, URI: uri(forge.CollectionPull, now.Add(-40*24*time.Hour))}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := pastRetention(tt.ev, cutoff); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
