package intake

import (
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/rules/work"
)

// pastRetention reports whether a push is older than the retention:
// its record key is a TID, the time of the push. Such a push is never
// work, so nothing needs to be remembered of it. Pulls are judged by
// whether they are still listed (an old pull gets new commits).
func pastRetention(ev work.Event, cutoff time.Time) bool {
	if ev.Kind != forge.KindPush {
		return false
	}
	tid, err := syntax.ParseTID(ev.URI.RecordKey().String())
	return err == nil && tid.Time().Before(cutoff)
}

// pruneAfter forgets what the last reconcile shows needs no memory:
// done events and final checks older than the retention, except those
// of events still listed and work (whose memory stops them running
// again) and owed checks; the authors whose budget is full again; and
// the deferred events no longer listed.
func (in *Intake) pruneAfter(snap *ingest.Snapshot) {
	cutoff := time.Now().Add(-in.cfg.Retention)
	need := map[string]bool{}
	for _, ev := range snap.Events {
		if !pastRetention(ev, cutoff) {
			need[ev.Key()] = true
		}
	}
	in.budget.forgetFull(time.Now())
	in.mu.Lock()
	// A deferred event no longer listed (a pull closed, or moved on to
	// a newer commit) is not waiting any more; pre-flights are the
	// lander's, not listed; run-control events are this reconcile's.
	for k := range in.deferred {
		if !need[k] && !strings.HasPrefix(k, "preflight ") && !in.controlled[k] {
			delete(in.deferred, k)
		}
	}
	clear(in.controlled)
	in.mu.Unlock()
	keep := func(k string) bool { return need[k] }
	done, err := in.p.State.Prune(cutoff, keep)
	if err != nil {
		in.log.Error("save state", "err", err)
	}
	final := in.p.Checks.Forget(cutoff, keep)
	if done == 0 && final == 0 {
		return
	}
	in.log.Debug("forgot final work past the retention", "done_events", done, "checks", final, "retention", in.cfg.Retention)
}
