package intake

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// Floods: what one event, and one author, may make the runner do and
// write. Every check record is a write on the runner's PDS, which limits
// them (the hosted PDS: 5,000 points an hour); one pull with a hundred
// workflows, moved five times, made 905 of them. The rules are pure
// (Caps.decide, writeBudget; caps_test.go); Consider applies them, with
// what intake knows of an event and its author (capsSay). See
// docs/design/daemon.md, "Floods".

// Defaults of the caps (Caps; serve's flags).
const (
	// DefaultMaxWorkflowsPerEvent: most workflows one event may run
	// (--max-workflows-per-event).
	DefaultMaxWorkflowsPerEvent = 20
	// DefaultMaxQueuedPerAuthor: most runs of one author queued or
	// running at once (--max-queued-per-author).
	DefaultMaxQueuedPerAuthor = 20
	// DefaultMaxCheckWritesPerAuthor: check writes one author's events
	// may cause per DefaultCheckWriteWindow
	// (--max-check-writes-per-author).
	DefaultMaxCheckWritesPerAuthor = 200
	DefaultCheckWriteWindow        = time.Hour
	// NoCap, as any of the Caps in Config, turns it off.
	NoCap = -1
)

// writesPerRun are the check writes of one run: queued, running, final.
const writesPerRun = 3

// Caps are the operator's flood caps. In Config, 0 is a cap's
// default and NoCap none; the rules read 0 or less as none.
type Caps struct {
	// WorkflowsPerEvent: most workflows one event may run.
	WorkflowsPerEvent int
	// QueuedPerAuthor: most runs of one author queued or running.
	QueuedPerAuthor int
	// CheckWritesPerAuthor: check writes of one author's events per
	// Window (refilled continuously).
	CheckWritesPerAuthor int
	Window               time.Duration
}

func (c *Caps) defaults() {
	if c.WorkflowsPerEvent == 0 {
		c.WorkflowsPerEvent = DefaultMaxWorkflowsPerEvent
	}
	if c.QueuedPerAuthor == 0 {
		c.QueuedPerAuthor = DefaultMaxQueuedPerAuthor
	}
	if c.CheckWritesPerAuthor == 0 {
		c.CheckWritesPerAuthor = DefaultMaxCheckWritesPerAuthor
	}
	if c.Window <= 0 {
		c.Window = DefaultCheckWriteWindow
	}
}

// need is what an event would make. Before its workflows are read
// (known false) nothing is known of it but that it is work.
type need struct {
	known bool
	// checks are the workflows that would get a check: those that match
	// the event and the invalid workflow files (--max-workflows-per-event).
	checks int
	// runs are the runs it would queue (their checks not final yet),
	// errors the error checks it would write instead of runs.
	runs, errors int
}

// writes are the check writes the event would cause at most.
func (n need) writes() int { return writesPerRun*n.runs + n.errors }

// load is an author's work in hand, as the caps count it.
type load struct {
	// runs are the author's runs queued or running, but those of an
	// older commit of the same pull (or push ref) the event supersedes.
	runs int
	// owing are the check writes the author's runs in hand will still
	// make: 2 for a queued run (running, final), 1 for a running one.
	owing int
	// left are the check writes left in the author's budget (+Inf with
	// none); below zero when the writes of runs in hand overdrew it.
	left float64
}

type verdict int

const (
	admit  verdict = iota
	wait           // deferred: no check, not done; a later reconcile tries again
	refuse         // one error check naming the limit; the event is done
)

// decision is what the caps say of an event: its verdict, the flag of
// the limit that decided, and why, for the log (wait) or the error
// check (refuse).
type decision struct {
	verdict verdict
	flag    string
	why     string
}

// Flags the decisions name.
const (
	flagPerEvent  = "--max-workflows-per-event"
	flagPerAuthor = "--max-queued-per-author"
	flagWrites    = "--max-check-writes-per-author"
)

// decide applies the caps to an event. capped says whether the author
// caps apply to it (job.Author(ev) is not ""); the caller clears
// WorkflowsPerEvent for the work the per-event cap does not bound.
//
//   - More checks than WorkflowsPerEvent: refused, one error check for
//     the event.
//   - An author that holds runs waits while the event's runs would take
//     it over QueuedPerAuthor. One that holds none is never held back
//     by it: an event bigger than the cap runs alone (WorkflowsPerEvent
//     bounds it).
//   - An author waits while the writes its runs in hand still owe,
//     plus the event's (at most the whole budget), are more than its
//     budget has left: so its writes stay within the budget, overdrawn
//     at most by one event admitted on a full budget.
//   - A refusal writes one check, so a capped author's needs one write
//     of budget too.
//
// Before the workflows are read, an event is taken to need one run: an
// author at its cap, or with its budget spent, waits before any fetch.
func (c Caps) decide(capped bool, n need, l load) decision {
	if n.known && c.WorkflowsPerEvent > 0 && n.checks > c.WorkflowsPerEvent {
		if capped && c.CheckWritesPerAuthor > 0 && float64(l.owing+1) > l.left {
			return c.overBudget(l, 1)
		}
		why := fmt.Sprintf("%d workflows match this event, more than %s allows (%d): none of them runs", n.checks, flagPerEvent, c.WorkflowsPerEvent)
		if n.errors > 0 {
			why = fmt.Sprintf("%d workflows match this event (%d of them invalid files), more than %s allows (%d): none of them runs",
				n.checks, n.errors, flagPerEvent, c.WorkflowsPerEvent)
		}
		return decision{verdict: refuse, flag: flagPerEvent, why: why}
	}
	if !capped || (n.known && n.writes() == 0) {
		return decision{verdict: admit}
	}
	runs, writes := 1, 1
	if n.known {
		runs, writes = n.runs, n.writes()
	}
	if c.QueuedPerAuthor > 0 && l.runs > 0 && l.runs+runs > c.QueuedPerAuthor {
		return decision{verdict: wait, flag: flagPerAuthor,
			why: fmt.Sprintf("its author has %d runs queued or running and it would add %d, more than %s %d", l.runs, runs, flagPerAuthor, c.QueuedPerAuthor)}
	}
	if c.CheckWritesPerAuthor > 0 && float64(l.owing+min(writes, c.CheckWritesPerAuthor)) > l.left {
		return c.overBudget(l, min(writes, c.CheckWritesPerAuthor))
	}
	return decision{verdict: admit}
}

func (c Caps) overBudget(l load, writes int) decision {
	return decision{verdict: wait, flag: flagWrites,
		why: fmt.Sprintf("its author's check writes left (%.0f of %d per %s, %d of them owed to runs in hand) are fewer than the %d it needs (%s)",
			max(0, math.Floor(l.left)), c.CheckWritesPerAuthor, c.Window, l.owing, writes, flagWrites)}
}

// writeBudget counts each author's check writes: a token bucket of n
// writes per author, refilled continuously at n per window
// (golang.org/x/time/rate). A write that happened is always counted,
// even past the budget (spend); the caps read what is left (left). It
// has its own lock, taken for no I/O; a nil *writeBudget is no budget.
type writeBudget struct {
	n     int
	every rate.Limit

	mu  sync.Mutex
	per map[string]*rate.Limiter
}

// newWriteBudget returns a budget of n writes per window; nil for n ≤ 0.
func newWriteBudget(n int, window time.Duration) *writeBudget {
	if n <= 0 {
		return nil
	}
	return &writeBudget{n: n, every: rate.Limit(float64(n) / window.Seconds()), per: map[string]*rate.Limiter{}}
}

// spend counts one check write of author a at now.
func (b *writeBudget) spend(a string, now time.Time) {
	if b == nil || a == "" {
		return
	}
	b.mu.Lock()
	lim, ok := b.per[a]
	if !ok {
		lim = rate.NewLimiter(b.every, b.n)
		b.per[a] = lim
	}
	b.mu.Unlock()
	lim.ReserveN(now, 1)
}

// left is the writes left to a at now: n for an author with none
// counted, +Inf without a budget.
func (b *writeBudget) left(a string, now time.Time) float64 {
	if b == nil {
		return math.Inf(1)
	}
	b.mu.Lock()
	lim, ok := b.per[a]
	b.mu.Unlock()
	if !ok {
		return float64(b.n)
	}
	return lim.TokensAt(now)
}

// forgetFull drops the authors whose budget has filled up again, so
// that memory follows the authors writing now; it returns how many.
func (b *writeBudget) forgetFull(now time.Time) int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for a, lim := range b.per {
		if lim.TokensAt(now) >= float64(b.n) {
			delete(b.per, a)
			n++
		}
	}
	return n
}

// deferral is an event waiting for its author's caps: the limit it
// waits for (logged once per limit) and what it needs, once its
// workflows were read (so the next look needs no fetch).
type deferral struct {
	flag string
	need need
}

// capsFor are the flood caps that apply to ev. The merge queue's own
// work (a queued pull's pre-flight, a batch) is not bounded per event:
// the owner queued the pull at that commit, and the lander waits for
// each workflow's check, which one refusal would never write.
func (in *Intake) capsFor(ev work.Event) Caps {
	c := in.cfg.Caps
	if ev.Preflight || ev.Kind == forge.KindBatch {
		c.WorkflowsPerEvent = 0
	}
	return c
}

// capsSay applies the caps to ev, which needs n (before its workflows
// are read: what an earlier look found, if one did), with its author's
// load now, and remembers whether it waits. first is true the first
// time it waits for that limit.
func (in *Intake) capsSay(ev work.Event, n need) (dec decision, first bool) {
	a := job.Author(ev, in.facts.LimitsAll)
	now := time.Now()
	if !n.known {
		in.mu.Lock()
		n = in.deferred[ev.Key()].need
		in.mu.Unlock()
	}
	var l load
	if a != "" {
		l.runs, l.owing = in.p.Scheduler.Load(a, ev)
		l.left = in.budget.left(a, now)
	}
	dec = in.capsFor(ev).decide(a != "", n, l)
	in.mu.Lock()
	defer in.mu.Unlock()
	return dec, in.hold(ev.Key(), dec, n)
}

// hold remembers whether an event waits for its author's caps (d is
// the caps' decision) and, when it does, what it needs (n, when known;
// else what was known before): first is true the first time it waits
// for d's limit, so that it is logged once. The caller holds in.mu.
func (in *Intake) hold(evKey string, d decision, n need) (first bool) {
	if d.verdict != wait {
		delete(in.deferred, evKey)
		return false
	}
	prev, was := in.deferred[evKey]
	if !n.known {
		n = prev.need
	}
	in.deferred[evKey] = deferral{flag: d.flag, need: n}
	return !was || prev.flag != d.flag
}

// deferEvent logs, once per limit, an event that waits for its author's
// caps.
func (in *Intake) deferEvent(log *slog.Logger, ev work.Event, dec decision, first bool) {
	if in.p.Observer != nil {
		in.p.Observer.Deferred(ev, dec.flag)
	}
	what := ev.Kind
	if ev.Cause != "" {
		what = "the work of " + ev.Cause // a re-run or a dispatch
	}
	if first {
		log.Info(what+" deferred: "+dec.why+"; it waits, without a check, until its author's runs end or its budget refills",
			"author", job.Author(ev, in.facts.LimitsAll), "limit", dec.flag)
	}
}

// NoteCheck is told of every check record written (the recorder's
// hook): it counts the write against its author's budget.
func (in *Intake) NoteCheck(_ string, c forge.Check) {
	in.budget.spend(job.CheckAuthor(c, in.facts.LimitsAll), time.Now())
}
