package daemon

import (
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/state"
)

// pastRetention reports whether a push is older than the retention:
// its record key is a TID, the time of the push. Such a push is never
// work, so nothing needs to be remembered of it. Pulls are judged by
// whether they are still listed (an old pull gets new commits).
func pastRetention(ev ingest.Event, cutoff time.Time) bool {
	if ev.Kind != forge.KindPush {
		return false
	}
	tid, err := syntax.ParseTID(ev.URI.RecordKey().String())
	return err == nil && tid.Time().Before(cutoff)
}

// prune forgets the final work older than cutoff: done events and final
// checks, except those of events in need (listed and still work, whose
// memory stops them running again) and owed checks. It returns how many
// of each went.
func prune(st *state.State, forget func(drop func(key string, c forge.Check) bool) int, need map[string]bool, cutoff time.Time) (done, final int) {
	done = st.Prune(cutoff, func(k string) bool { return need[k] })
	final = forget(func(key string, c forge.Check) bool {
		if !c.Final() || need[c.Subject.Event+"@"+c.Subject.Commit] {
			return false
		}
		if _, owed := st.Owed[key]; owed {
			return false
		}
		at := c.FinishedAt
		if at == "" {
			at = c.CreatedAt
		}
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(at))
		return err == nil && t.Before(cutoff)
	})
	return done, final
}

// pruneAfter forgets what the last reconcile shows needs no memory.
func (d *Daemon) pruneAfter(snap *ingest.Snapshot) {
	cutoff := time.Now().Add(-d.cfg.Retention)
	need := map[string]bool{}
	for _, ev := range snap.Events {
		if !pastRetention(ev, cutoff) {
			need[ev.Key()] = true
		}
	}
	d.budget.forgetFull(time.Now())
	d.mu.Lock()
	// A deferred event no longer listed (a pull closed, or moved on to
	// a newer commit) is not waiting any more; pre-flights are the
	// lander's, not listed.
	d.q.forgetDeferred(func(k string) bool { return !need[k] && !strings.HasPrefix(k, "preflight ") })
	done, final := prune(d.st, d.rec.Forget, need, cutoff)
	var saved stateSnapshot
	if done > 0 {
		saved = d.sf.snapshot(d.st)
	}
	d.mu.Unlock()
	if done == 0 && final == 0 {
		return
	}
	if done > 0 {
		if err := d.sf.write(saved); err != nil {
			d.log.Error("save state", "err", err)
		}
	}
	d.log.Debug("forgot final work past the retention", "done_events", done, "checks", final, "retention", d.cfg.Retention)
}
