package mergequeue

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
)

const repo = "at://did:plc:owner/dev.knotless.repo/hello"

func commit(c string) string { return strings.Repeat(c, 40) }

func pc(n, c string) PullCommit {
	return PullCommit{Pull: "at://did:plc:author/dev.knotless.pull/" + n, Commit: commit(c)}
}

func entry(key, at string, p PullCommit) Entry {
	return Entry{Key: key, Pull: p.Pull, Commit: p.Commit, Base: "main", CreatedAt: "2026-01-01T00:00:0" + at + ".000Z"}
}

// self is the runner deciding; the cases of TestDecide grant it landing
// unless they say otherwise.
const self = "did:plc:lander"

func open(p PullCommit) Pull { return Pull{Repo: repo, Base: "main", Head: p.Commit, Open: true} }

func TestOrder(t *testing.T) {
	t.Parallel()
	a, b, b2 := pc("a", "1"), pc("b", "2"), pc("b", "3")
	got := Order([]Entry{entry("k3", "3", b2), entry("k2", "1", b), entry("k1", "2", a), entry("k0", "2", pc("c", "4"))})
	want := []Entry{entry("k0", "2", pc("c", "4")), entry("k1", "2", a), entry("k3", "3", b2)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	a, b, c := pc("a", "1"), pc("b", "2"), pc("c", "3")
	q := func(p PullCommit) Queued { return Queued{PullCommit: p, Base: "main"} }
	for _, tc := range []struct {
		name string
		in   Input
		want Plan
	}{
		{"no pre-flight: all ready in order", Input{
			Entries: []Entry{entry("k2", "2", b), entry("k1", "1", a)},
			Pulls:   map[string]Pull{a.Pull: open(a), b.Pull: open(b)},
		}, Plan{Ready: []Queued{q(a), q(b)}}},
		{"head moved leaves the queue", Input{
			Entries: []Entry{entry("k1", "1", a)},
			Pulls:   map[string]Pull{a.Pull: {Repo: repo, Base: "main", Head: commit("9"), Open: true}},
		}, Plan{Eject: []Ejection{{PullCommit: a, Reason: forge.EjectHeadMoved, Detail: "the head moved from the approved 111111111111 to 999999999999"}}}},
		{"closed and gone leave the queue", Input{
			Entries: []Entry{entry("k1", "1", a), entry("k2", "2", b)},
			Pulls:   map[string]Pull{a.Pull: {Repo: repo, Base: "main", Head: a.Commit}},
		}, Plan{Eject: []Ejection{
			{PullCommit: a, Reason: forge.EjectClosed, Detail: "the pull is no longer open"},
			{PullCommit: b, Reason: forge.EjectClosed, Detail: "the pull record is gone"},
		}}},
		{"done entries are not acted on again", Input{
			Entries: []Entry{entry("k1", "1", a), entry("k2", "2", b)},
			Pulls:   map[string]Pull{b.Pull: open(b)},
			Done:    map[PullCommit]bool{a: true},
		}, Plan{Ready: []Queued{q(b)}}},
		{"pull of another repository is skipped", Input{
			Entries: []Entry{entry("k1", "1", a)},
			Pulls:   map[string]Pull{a.Pull: {Repo: "at://did:plc:x/dev.knotless.repo/other", Base: "main", Head: a.Commit, Open: true}},
		}, Plan{}},
		{"pre-flight gates entry", Input{
			Entries:       []Entry{entry("k1", "1", a), entry("k2", "2", b), entry("k3", "3", c), entry("k4", "4", pc("d", "4")), entry("k5", "5", pc("e", "5"))},
			Pulls:         map[string]Pull{a.Pull: open(a), b.Pull: open(b), c.Pull: open(c), pc("d", "4").Pull: open(pc("d", "4")), pc("e", "5").Pull: open(pc("e", "5"))},
			NeedPreflight: true,
			Preflights: map[PullCommit]Preflight{
				b:            {Verdict: Pending},
				c:            {Verdict: Passed},
				pc("d", "4"): {Verdict: Failed, Detail: "workflow lint failed"},
				pc("e", "5"): {Verdict: Conflict, Detail: "a.txt"},
			},
		}, Plan{
			Preflight: []Queued{q(a)},
			Pending:   []Queued{q(b)},
			Ready:     []Queued{q(c)},
			Eject: []Ejection{
				{PullCommit: pc("d", "4"), Reason: forge.EjectPreflight, Detail: "workflow lint failed"},
				{PullCommit: pc("e", "5"), Reason: forge.EjectConflictBase, Detail: "a.txt"},
			},
		}},
		{"base changed after queueing leaves the queue", Input{
			Entries: []Entry{entry("k1", "1", a), entry("k2", "2", b)},
			Pulls:   map[string]Pull{a.Pull: {Repo: repo, Base: "release", Head: a.Commit, Open: true}, b.Pull: open(b)},
		}, Plan{
			Eject: []Ejection{{PullCommit: a, Reason: forge.EjectBaseChanged,
				Detail: `base changed after queueing: the entry approved "main", the pull now targets "release"; queue it again to land it there`}},
			Ready: []Queued{q(b)},
		}},
		{"base changed and head moved: the base is named", Input{
			Entries: []Entry{entry("k1", "1", a)},
			Pulls:   map[string]Pull{a.Pull: {Repo: repo, Base: "release", Head: commit("9"), Open: true}},
		}, Plan{Eject: []Ejection{{PullCommit: a, Reason: forge.EjectBaseChanged,
			Detail: `base changed after queueing: the entry approved "main", the pull now targets "release"; queue it again to land it there`}}}},
		{"the batch takes the entry's base", Input{
			Entries: []Entry{{Key: "k1", Pull: a.Pull, Commit: a.Commit, Base: "release", CreatedAt: "2026-01-01T00:00:01.000Z"}},
			Pulls:   map[string]Pull{a.Pull: {Repo: repo, Base: "release", Head: a.Commit, Open: true}},
		}, Plan{Ready: []Queued{{PullCommit: a, Base: "release"}}}},
		{"an entry naming no base leaves the queue, with no pre-flight", Input{
			Entries:       []Entry{{Key: "k1", Pull: a.Pull, Commit: a.Commit, CreatedAt: "2026-01-01T00:00:01.000Z"}},
			Pulls:         map[string]Pull{a.Pull: open(a)},
			NeedPreflight: true,
		}, Plan{Eject: []Ejection{{PullCommit: a, Reason: forge.EjectNoBase,
			Detail: "the queue entry names no base branch, so what the owner approved is unknown; queue the pull again with base set to the branch it is to land on"}}}},
		{"not among the landers: every entry leaves, nothing is pre-flighted", Input{
			Lander:        self,
			MayLand:       false,
			Entries:       []Entry{entry("k1", "1", a), entry("k2", "2", b), entry("k3", "3", c)},
			Pulls:         map[string]Pull{a.Pull: open(a), b.Pull: open(b)},
			NeedPreflight: true,
			Preflights:    map[PullCommit]Preflight{b: {Verdict: Passed}},
			Done:          map[PullCommit]bool{c: true},
		}, Plan{Eject: []Ejection{
			{PullCommit: a, Reason: forge.EjectNotLander, Detail: "this runner (" + self + ") is not among the repository's landers, so it pushes nothing; the owner adds it to the repo record's landers to let it land"},
			{PullCommit: b, Reason: forge.EjectNotLander, Detail: "this runner (" + self + ") is not among the repository's landers, so it pushes nothing; the owner adds it to the repo record's landers to let it land"},
		}}},
		{"re-queued at the new head", Input{
			Entries: []Entry{entry("k1", "1", a), entry("k2", "2", PullCommit{Pull: a.Pull, Commit: commit("7")})},
			Pulls:   map[string]Pull{a.Pull: {Repo: repo, Base: "main", Head: commit("7"), Open: true}},
			Done:    map[PullCommit]bool{a: true},
		}, Plan{Ready: []Queued{q(PullCommit{Pull: a.Pull, Commit: commit("7")})}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.in.Repo = repo
			if tc.in.Lander == "" {
				tc.in.Lander, tc.in.MayLand = self, true
			}
			if diff := cmp.Diff(tc.want, Decide(tc.in)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNext(t *testing.T) {
	t.Parallel()
	a, b, c, d := pc("a", "1"), pc("b", "2"), pc("c", "3"), pc("d", "4")
	q := func(p PullCommit, base string) Queued { return Queued{PullCommit: p, Base: base} }
	ready := []Queued{q(a, "main"), q(b, "dev"), q(c, "main"), q(d, "main")}
	for _, tc := range []struct {
		name string
		max  int
		b    Bisect
		want []Queued
	}{
		{"first base, in order", 0, Bisect{}, []Queued{q(a, "main"), q(c, "main"), q(d, "main")}},
		{"at most max", 2, Bisect{}, []Queued{q(a, "main"), q(c, "main")}},
		{"suspects only, at most the limit", 0, Bisect{Suspects: []PullCommit{d, c}, Limit: 1}, []Queued{q(c, "main")}},
		{"no suspect ready: whole queue", 1, Bisect{Suspects: []PullCommit{pc("z", "9")}, Limit: 1}, []Queued{q(a, "main")}},
	} {
		if diff := cmp.Diff(tc.want, Next(ready, tc.max, tc.b)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	if got := Next(nil, 0, Bisect{}); got != nil {
		t.Errorf("empty queue: got %v", got)
	}
}

// TestBisect drives a bisection to its end: four pulls, c fails only in
// a batch; the others land, c is ejected with reason batch.
func TestBisect(t *testing.T) {
	t.Parallel()
	a, b, c, d := pc("a", "1"), pc("b", "2"), pc("c", "3"), pc("d", "4")
	var ready []Queued
	for _, p := range []PullCommit{a, b, c, d} {
		ready = append(ready, Queued{PullCommit: p, Base: "main"})
	}
	var bis Bisect
	var landed []PullCommit
	var ejected []Ejection
	for round := 0; len(ready) > 0; round++ {
		if round > 10 {
			t.Fatalf("no end: landed %v ejected %v", landed, ejected)
		}
		var batch []PullCommit
		for _, q := range Next(ready, 0, bis) {
			batch = append(batch, q.PullCommit)
		}
		remove := func(ps ...PullCommit) {
			var keep []Queued
			for _, q := range ready {
				if !containsPC(ps, q.PullCommit) {
					keep = append(keep, q)
				}
			}
			ready = keep
		}
		if containsPC(batch, c) {
			var ej *Ejection
			bis, ej = bis.Failed(batch, "workflow test failed")
			if ej != nil {
				ejected = append(ejected, *ej)
				remove(ej.PullCommit)
			}
			continue
		}
		bis = bis.Landed(batch)
		landed = append(landed, batch...)
		remove(batch...)
	}
	if diff := cmp.Diff([]PullCommit{a, b, d}, landed); diff != "" {
		t.Errorf("landed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Ejection{{PullCommit: c, Reason: forge.EjectBatch, Detail: "workflow test failed"}}, ejected); diff != "" {
		t.Errorf("ejected (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Bisect{}, bis); diff != "" {
		t.Errorf("bisection not over (-want +got):\n%s", diff)
	}
}

func containsPC(ps []PullCommit, p PullCommit) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

func TestSort(t *testing.T) {
	t.Parallel()
	a, b, c, d, e := pc("a", "1"), pc("b", "2"), pc("c", "3"), pc("d", "4"), pc("e", "5")
	in, out := Sort([]Merge{
		{PullCommit: a, Changed: []string{"x.txt"}},
		{PullCommit: b, Changed: []string{"y.txt"}},
		{PullCommit: c, Conflicts: []string{"base.txt"}, ConflictsWithBase: true},
		{PullCommit: d, Conflicts: []string{"x.txt"}},
		{PullCommit: e, Conflicts: []string{"z.txt"}},
	})
	if diff := cmp.Diff([]PullCommit{a, b}, in); diff != "" {
		t.Errorf("in (-want +got):\n%s", diff)
	}
	want := []Ejection{
		{PullCommit: c, Reason: forge.EjectConflictBase, Detail: "conflicts with the base branch: base.txt"},
		{PullCommit: d, Reason: forge.EjectConflictPull, Detail: "conflicts with the earlier pull " + a.Pull + " of the batch: x.txt"},
		{PullCommit: e, Reason: forge.EjectConflictPull, Detail: "conflicts with the earlier pull " + b.Pull + " of the batch: z.txt"},
	}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("out (-want +got):\n%s", diff)
	}
}

func TestResume(t *testing.T) {
	t.Parallel()
	base, sq, other := commit("1"), commit("2"), commit("3")
	for _, tc := range []struct {
		name   string
		status string
		sq     string
		head   string
		passed bool
		want   Step
	}{
		{"landed is finished", forge.BatchLanded, sq, sq, true, Finished},
		{"failed is finished", forge.BatchFailed, sq, base, false, Finished},
		{"rebuilt is finished", forge.BatchRebuilt, sq, other, false, Finished},
		{"building: build again", forge.BatchBuilding, "", base, false, Build},
		{"running, checks not done: build again", forge.BatchRunning, sq, base, false, Build},
		{"running, checks passed: push", forge.BatchRunning, sq, base, true, Push},
		{"pushed but not recorded: record, never push again", forge.BatchRunning, sq, sq, true, RecordLanding},
		{"base moved: rebuild, never force", forge.BatchRunning, sq, other, true, Rebuild},
	} {
		b := forge.Batch{Base: base, Squashed: tc.sq, Status: tc.status}
		if got := Resume(b, tc.head, tc.passed); got != tc.want {
			t.Errorf("%s: got step %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestIsLander(t *testing.T) {
	t.Parallel()
	r := &forge.Repo{Runners: []string{"did:a", "did:b"}, Landers: []string{"did:b"}}
	if IsLander(r, "did:a") || !IsLander(r, "did:b") || IsLander(r, "") || IsLander(&forge.Repo{}, "") {
		t.Error("lander: want did:b only")
	}
}

// The runner that decides the queue may push only when the owner's
// landers name it: the fallback lander (the first runner, when no
// runner is in landers) decides but may not push.
func TestMayPush(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		repo    forge.Repo
		self    string
		lander  bool
		mayPush bool
	}{
		{"named lander", forge.Repo{Runners: []string{"did:a", "did:b"}, Landers: []string{"did:b"}}, "did:b", true, true},
		{"fallback lander, landers empty", forge.Repo{Runners: []string{"did:a", "did:b"}}, "did:a", true, false},
		{"fallback lander, landers name a runner not listed", forge.Repo{Runners: []string{"did:a"}, Landers: []string{"did:z"}}, "did:a", true, false},
		{"granted but not the lander", forge.Repo{Runners: []string{"did:a", "did:b"}, Landers: []string{"did:a", "did:b"}}, "did:b", false, true},
		{"no runner", forge.Repo{Landers: []string{""}}, "", false, false},
	} {
		if got := IsLander(&c.repo, c.self); got != c.lander {
			t.Errorf("%s: IsLander %v, want %v", c.name, got, c.lander)
		}
		if got := MayPush(&c.repo, c.self); got != c.mayPush {
			t.Errorf("%s: MayPush %v, want %v", c.name, got, c.mayPush)
		}
	}
}

func TestSettled(t *testing.T) {
	t.Parallel()
	q := Queued{PullCommit: pc("a", "1"), Base: "main"}
	for _, c := range []struct {
		p    Plan
		want bool
	}{
		{Plan{}, true},
		{Plan{Ready: []Queued{q}, Eject: []Ejection{{PullCommit: q.PullCommit}}}, true},
		{Plan{Ready: []Queued{q}, Pending: []Queued{q}}, false},
		{Plan{Ready: []Queued{q}, Preflight: []Queued{q}}, false},
	} {
		if got := c.p.Settled(); got != c.want {
			t.Errorf("%+v settled: %v, want %v", c.p, got, c.want)
		}
	}
}
