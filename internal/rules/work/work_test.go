package work

import (
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
)

// A run-control event's key, check keys, attempts and cache order.
func TestControlEvent(t *testing.T) {
	t.Parallel()
	repo := forge.Record[forge.Repo]{URI: "at://did:plc:o/dev.knotless.repo/r"}
	push := Event{Kind: forge.KindPush, URI: "at://did:plc:o/dev.knotless.refUpdate/3k1", Repo: repo, Ref: "refs/heads/main", Commit: strings.Repeat("a", 40)}
	rerun := push
	rerun.Control = Control{Cause: "at://did:plc:o/dev.knotless.rerun/3r1", Workflows: map[string]int64{"ci": 2, "lint": 1}}
	if rerun.Key() == push.Key() || rerun.Key() != rerun.Cause+"@"+push.Commit {
		t.Errorf("a re-run's key %q (the push's %q)", rerun.Key(), push.Key())
	}
	if got, want := rerun.CheckKey("ci"), forge.AttemptKey(push.Subject(), "ci", 2); got != want {
		t.Errorf("attempt 2's key %s, want %s", got, want)
	}
	if got, want := rerun.CheckKey("lint"), forge.CheckKey(push.Subject(), "lint"); got != want {
		t.Errorf("attempt 1's key %s, want the first's %s", got, want)
	}
	if rerun.Attempt("ci") != 2 || rerun.Attempt("lint") != 0 || push.Attempt("ci") != 0 {
		t.Errorf("attempts %d %d %d", rerun.Attempt("ci"), rerun.Attempt("lint"), push.Attempt("ci"))
	}
	if rerun.Subject() != push.Subject() {
		t.Error("a re-run's subject is not its original's")
	}
	tick := Event{Kind: forge.KindSchedule, URI: repo.URI, Repo: repo, Commit: push.Commit,
		Control: Control{Workflows: map[string]int64{"nightly": 1}, Tick: "2026-12-05T03:00:00Z"}}
	if tick.Subject().Tick != tick.Tick || !strings.Contains(tick.Key(), tick.Tick) {
		t.Errorf("a tick's subject %+v, key %q", tick.Subject(), tick.Key())
	}
	later := tick
	later.Tick = "2026-12-06T03:00:00Z"
	if tick.Order() >= later.Order() || push.Order() != "3k1" {
		t.Errorf("orders: tick %s, later %s, push %s", tick.Order(), later.Order(), push.Order())
	}
	if _, err := syntax.ParseTID(tick.Order()); err != nil {
		t.Errorf("a tick's order %q is not a TID: %v", tick.Order(), err)
	}
}
