package daemon

import (
	"log/slog"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
)

// The daemon's side of the flood caps (flood.go): what it knows of an
// event and its author, handed to the pure rules.

// Listing bounds a reconcile's listings: the pages and records of each
// (forge.ListLimits: 100 pages, 10,000 records), and the deadline of
// each listing task and how many run at once (ingest.Bounds: 1 min, 8).
// A hostile or slow PDS holds no reconcile past them.
type Listing struct {
	Limits forge.ListLimits
	Bounds ingest.Bounds
}

// caps are the flood caps that apply to ev. The merge queue's own work
// (a queued pull's pre-flight, a batch) is not bounded per event: the
// owner queued the pull at that commit, and the lander waits for each
// workflow's check, which one refusal would never write.
func (d *Daemon) caps(ev ingest.Event) Caps {
	c := d.cfg.Caps
	if ev.Preflight || ev.Kind == forge.KindBatch {
		c.WorkflowsPerEvent = 0
	}
	return c
}

// capsSay applies the caps to ev, which needs n (before its workflows
// are read: what an earlier look found, if one did), with its author's
// load now, and remembers whether it waits. first is true the first
// time it waits for that limit.
func (d *Daemon) capsSay(ev ingest.Event, n need) (dec decision, first bool) {
	a := author(ev, d.cfg.Max.All)
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !n.known {
		n = d.q.need(ev.Key())
	}
	var l load
	if a != "" {
		l.runs, l.owing = d.q.load(a, d.cfg.Max.All, ev)
		l.left = d.budget.left(a, now)
	}
	dec = d.caps(ev).decide(a != "", n, l)
	return dec, d.q.hold(ev.Key(), dec, n)
}

// deferred logs, once per limit, an event that waits for its author's
// caps.
func (d *Daemon) deferred(log *slog.Logger, ev ingest.Event, dec decision, first bool) {
	if first {
		log.Info(ev.Kind+" deferred: "+dec.why+"; it waits, without a check, until its author's runs end or its budget refills",
			"author", author(ev, d.cfg.Max.All), "limit", dec.flag)
	}
}

// noteCheck is told of every check record written (the recorder's
// hook): it counts the write against its author's budget, then tells
// Config.OnCheck.
func (d *Daemon) noteCheck(key string, c forge.Check) {
	d.budget.spend(checkAuthor(c, d.cfg.Max.All), time.Now())
	if d.cfg.OnCheck != nil {
		d.cfg.OnCheck(key, c)
	}
}
