package intake

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestDecide is the flood caps' rule alone (flood.go).
func TestDecide(t *testing.T) {
	t.Parallel()
	c := Caps{WorkflowsPerEvent: 20, QueuedPerAuthor: 20, CheckWritesPerAuthor: 200, Window: time.Hour}
	full := load{left: 200}
	unknown := need{}
	runs := func(n int) need { return need{known: true, checks: n, runs: n} }
	for _, tc := range []struct {
		name    string
		c       Caps
		capped  bool
		n       need
		l       load
		want    verdict
		flag    string
		whyHas  string
		explain string
	}{
		{"a pull within every cap", c, true, runs(5), full, admit, "", "", ""},
		{"a pull with more workflows than an event may run", c, true, runs(21), full, refuse, flagPerEvent,
			"21 workflows match this event, more than --max-workflows-per-event allows (20)", "one error check, whatever its author holds"},
		{"invalid workflow files count", c, true, need{known: true, checks: 21, runs: 1, errors: 20}, full, refuse, flagPerEvent,
			"(20 of them invalid files)", "each would be a check of its own"},
		{"the owner's push with too many workflows", c, false, runs(21), load{}, refuse, flagPerEvent, "none of them runs",
			"the per-event cap applies to every event"},
		{"the owner's push otherwise", c, false, runs(20), load{left: math.Inf(1)}, admit, "", "", "pushes are not author-capped by default"},
		{"nothing to run", c, true, need{known: true}, load{runs: 40, owing: 80, left: -5}, admit, "", "", "an event with no work costs nothing"},

		{"before the fetch, an author at its cap", c, true, unknown, load{runs: 20, owing: 40, left: 150}, wait, flagPerAuthor,
			"its author has 20 runs queued or running and it would add 1", "no git work for a deferred event"},
		{"before the fetch, an author under its cap", c, true, unknown, load{runs: 19, owing: 38, left: 150}, admit, "", "", ""},
		{"runs over the author's cap", c, true, runs(6), load{runs: 15, owing: 30, left: 150}, wait, flagPerAuthor,
			"it would add 6, more than --max-queued-per-author 20", "counted by run, not by pull"},
		{"runs up to the author's cap", c, true, runs(5), load{runs: 15, owing: 30, left: 150}, admit, "", "", ""},
		{"an event bigger than the author's cap, alone", Caps{QueuedPerAuthor: 4, CheckWritesPerAuthor: 200, Window: time.Hour}, true, runs(10), full, admit, "", "",
			"an author with nothing in hand gets one event in"},
		{"an event bigger than the author's cap, not alone", Caps{QueuedPerAuthor: 4, CheckWritesPerAuthor: 200, Window: time.Hour}, true, runs(10), load{runs: 1, owing: 2, left: 190}, wait, flagPerAuthor, "", ""},

		{"before the fetch, a spent budget", c, true, unknown, load{runs: 2, owing: 4, left: 4.5}, wait, flagWrites,
			"check writes left (4 of 200 per 1h0m0s, 4 of them owed to runs in hand) are fewer than the 1 it needs", ""},
		{"writes over the budget", c, true, runs(10), load{runs: 2, owing: 4, left: 33}, wait, flagWrites, "fewer than the 30 it needs",
			"3 writes a run: queued, running, final"},
		{"writes within the budget", c, true, runs(10), load{runs: 2, owing: 4, left: 34}, admit, "", "", ""},
		{"an overdrawn budget", c, true, runs(1), load{left: -12}, wait, flagWrites, "left (0 of 200", ""},
		{"an event bigger than the budget, on a full one", Caps{WorkflowsPerEvent: 100, CheckWritesPerAuthor: 60, Window: time.Hour}, true, runs(30), load{left: 60}, admit, "", "",
			"it runs alone on a full budget"},
		{"an event bigger than the budget, on a used one", Caps{WorkflowsPerEvent: 100, CheckWritesPerAuthor: 60, Window: time.Hour}, true, runs(30), load{left: 59}, wait, flagWrites, "", ""},
		{"a refusal waits for a spent budget", c, true, runs(21), load{runs: 1, owing: 2, left: 2.5}, wait, flagWrites, "the 1 it needs",
			"a refusal is a write too"},

		{"no caps at all", Caps{}, true, runs(500), load{runs: 1000, owing: 2000, left: math.Inf(1)}, admit, "", "", ""},
	} {
		d := tc.c.decide(tc.capped, tc.n, tc.l)
		if d.verdict != tc.want || d.flag != tc.flag || !strings.Contains(d.why, tc.whyHas) {
			t.Errorf("%s: got %v %s %q; want %v %s with %q (%s)", tc.name, d.verdict, d.flag, d.why, tc.want, tc.flag, tc.whyHas, tc.explain)
		}
	}
}

// TestWriteBudget: each author has its own budget of n writes,
// refilled continuously at n per window; a write that happened counts
// even past the budget; an author whose budget is full again is
// forgotten.
func TestWriteBudget(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	b := newWriteBudget(60, time.Hour) // one a minute
	if got := b.left("did:plc:a", t0); got != 60 {
		t.Errorf("an unknown author has %v left, want the whole budget", got)
	}
	for range 70 {
		b.spend("did:plc:a", t0)
	}
	b.spend("", t0) // a write of no author's (a batch)
	if got := b.left("did:plc:a", t0); got != -10 {
		t.Errorf("after 70 writes: %v left, want -10 (overdrawn)", got)
	}
	if got := b.left("did:plc:b", t0); got != 60 {
		t.Errorf("another author: %v left, want 60", got)
	}
	if got := b.left("did:plc:a", t0.Add(30*time.Minute)); got != 20 {
		t.Errorf("half an hour later: %v left, want 20", got)
	}
	if n := b.forgetFull(t0.Add(time.Hour)); n != 0 {
		t.Errorf("forgot %d authors whose budget is not full yet", n)
	}
	if n := b.forgetFull(t0.Add(71 * time.Minute)); n != 1 || len(b.per) != 0 {
		t.Errorf("forgot %d, kept %d; want the full one forgotten", n, len(b.per))
	}
	var none *writeBudget = newWriteBudget(NoCap, time.Hour)
	none.spend("did:plc:a", t0)
	if got := none.left("did:plc:a", t0); !math.IsInf(got, 1) || none.forgetFull(t0) != 0 {
		t.Errorf("no budget: %v left, want +Inf", got)
	}
}
