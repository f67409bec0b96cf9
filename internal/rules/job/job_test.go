package job

import (
	"slices"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

func pullEvent(author, rkey, commit string) work.Event {
	return work.Event{Kind: forge.KindPull, URI: syntax.ATURI("at://" + author + "/" + forge.CollectionPull + "/" + rkey), Commit: commit}
}

// rerunOf is ev run again for actor's rerun record.
func rerunOf(ev work.Event, actor string) work.Event {
	ev.Control = work.Control{Cause: "at://" + actor + "/" + forge.CollectionRerun + "/3r1", Workflows: map[string]int64{"ci": 2}}
	return ev
}

func pushEvent(owner, rkey string) work.Event {
	return work.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://" + owner + "/" + forge.CollectionRefUpdate + "/" + rkey), Commit: "c" + rkey, Trusted: true}
}

// TestAuthor: whom the author caps count an event, and a check write,
// against: a pull's author; a tick's owner always; a push's owner only
// when the limits apply to all runs; a batch never.
func TestAuthor(t *testing.T) {
	t.Parallel()
	const spam, owner = "did:plc:spam", "did:plc:owner"
	p := pullEvent(spam, "p1", "a")
	p.Repo.URI = syntax.ATURI("at://" + owner + "/" + forge.CollectionRepo + "/r")
	pre := p
	pre.Preflight = true
	push := pushEvent(owner, "r1")
	push.Repo.URI = p.Repo.URI
	landing := work.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://did:plc:lander/" + forge.CollectionLanding + "/l1"),
		Repo: p.Repo, Trusted: true}
	batch := work.Event{Kind: forge.KindBatch, URI: syntax.ATURI("at://did:plc:lander/" + forge.CollectionBatch + "/b1"), Repo: p.Repo}
	for _, tc := range []struct {
		name string
		ev   work.Event
		all  bool
		want string
	}{
		{"a pull", p, false, spam},
		{"a pre-flight", pre, false, spam},
		{"the owner's push", push, false, ""},
		{"the owner's push, limits on all", push, true, owner},
		{"a landing, limits on all", landing, true, owner},
		{"a batch", batch, true, ""},
		{"a re-run of a push", rerunOf(push, "did:plc:owner"), false, owner},
		{"a pull's re-run by its author", rerunOf(p, spam), false, spam},
		{"a schedule's tick", work.Event{Kind: forge.KindSchedule, URI: p.Repo.URI, Repo: p.Repo, Trusted: true}, false, owner},
		{"a schedule's tick, limits on all", work.Event{Kind: forge.KindSchedule, URI: p.Repo.URI, Repo: p.Repo, Trusted: true}, true, owner},
	} {
		if got := Author(tc.ev, tc.all); got != tc.want {
			t.Errorf("%s: author %q, want %q", tc.name, got, tc.want)
		}
		c := forge.Check{Subject: tc.ev.Subject(), Cause: tc.ev.Cause}
		if got := CheckAuthor(c, tc.all); got != tc.want {
			t.Errorf("%s: its check's author %q, want %q, as its event's", tc.name, got, tc.want)
		}
	}
}

// TestRunsFor: a pre-flight runs the queue: first workflows whatever
// their on, a batch the on: batch ones on its base branch, pulls and
// pushes their own.
func TestRunsFor(t *testing.T) {
	t.Parallel()
	parse := func(name, src string) *workflow.Workflow {
		wf, err := workflow.Parse(".knotless/workflows/"+name+".yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return wf
	}
	pre := parse("pre", "on: push\nqueue: first\nsteps:\n  - run: x\n")
	batch := parse("batch", "on: batch\nbranches: [main]\nsteps:\n  - run: x\n")
	pull := parse("pull", "on: pull\nsteps:\n  - run: x\n")
	push := parse("push", "on: push\nsteps:\n  - run: x\n")
	// Its if: the pulls into main, and the trusted pushes of tags.
	cond := parse("cond", "on: [push, pull, batch]\nif: \"(event.kind == 'pull' && event.base == 'main') || (event.tag != '' && event.trusted)\"\nsteps:\n  - run: x\n")
	uri := syntax.ATURI("at://did:plc:x/dev.knotless.pull/3n3pa7x34wk22")
	mainPull := &forge.Pull{Base: "main"}
	devPull := &forge.Pull{Base: "dev"}
	for _, c := range []struct {
		name string
		ev   work.Event
		want []string
	}{
		{"pre-flight", work.Event{Kind: forge.KindPull, URI: uri, Ref: "refs/heads/main", Preflight: true, Pull: mainPull}, []string{"pre"}},
		{"pull", work.Event{Kind: forge.KindPull, URI: uri, Ref: "refs/heads/main", Pull: mainPull}, []string{"pull", "cond"}},
		{"pull into dev", work.Event{Kind: forge.KindPull, URI: uri, Ref: "refs/heads/dev", Pull: devPull}, []string{"pull"}},
		{"trusted push of a tag", work.Event{Kind: forge.KindPush, Ref: "refs/tags/v1", Trusted: true}, []string{"pre", "push", "cond"}},
		{"untrusted push of a tag", work.Event{Kind: forge.KindPush, Ref: "refs/tags/v1"}, []string{"pre", "push"}},
		{"a re-run names a workflow whose if does not hold", work.Event{Kind: forge.KindPush, Ref: "refs/heads/main",
			Control: work.Control{Cause: "at://did:plc:o/dev.knotless.rerun/3r1", Workflows: map[string]int64{"cond": 2}}}, []string{"cond"}},
		{"batch on main", work.Event{Kind: forge.KindBatch, Ref: "refs/heads/main"}, []string{"batch"}},
		{"batch on dev", work.Event{Kind: forge.KindBatch, Ref: "refs/heads/dev"}, nil},
		{"push", work.Event{Kind: forge.KindPush, Ref: "refs/heads/main"}, []string{"pre", "push"}},
		{"a re-run of one workflow", work.Event{Kind: forge.KindPush, Ref: "refs/heads/main",
			Control: work.Control{Cause: "at://did:plc:o/dev.knotless.rerun/3r1", Workflows: map[string]int64{"batch": 2}}}, []string{"batch"}},
	} {
		var got []string
		for _, wf := range []*workflow.Workflow{pre, batch, pull, push, cond} {
			if RunsFor(wf, c.ev) {
				got = append(got, wf.Name)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: runs %v, want %v", c.name, got, c.want)
		}
	}
	a := work.Event{Kind: forge.KindPull, URI: uri, Commit: "c"}
	b := a
	b.Preflight = true
	if a.Key() == b.Key() || forge.CheckKey(a.Subject(), "pre") != forge.CheckKey(b.Subject(), "pre") {
		t.Error("a pre-flight must be work apart from its pull (its own event key) yet share the pull's check of a workflow")
	}
}

// TestGroupAndOlder: what supersedes what. The same workflow on the
// same ref (a push) or the same pull is one group; a newer record, or
// a new commit of the same pull, is the newer.
func TestGroupAndOlder(t *testing.T) {
	t.Parallel()
	wf := &workflow.Workflow{Name: "ci"}
	repo := forge.Record[forge.Repo]{URI: "at://did:plc:owner/dev.knotless.repo/r"}
	push := func(rkey, ref string) *Job {
		ev := pushEvent("did:plc:owner", rkey)
		ev.Repo, ev.Ref = repo, ref
		return New(ev, wf, nil, ev.Commit)
	}
	pull := func(rkey, commit string) *Job {
		ev := pullEvent("did:plc:a", rkey, commit)
		ev.Repo, ev.Pull = repo, &forge.Pull{}
		return New(ev, wf, nil, commit)
	}
	a, b, dev := push("3k1", "refs/heads/main"), push("3k2", "refs/heads/main"), push("3k3", "refs/heads/dev")
	if a.Group() != b.Group() || a.Group() == dev.Group() || !Older(a, b) || Older(b, a) {
		t.Errorf("pushes: groups %q %q %q, older %v %v", a.Group(), b.Group(), dev.Group(), Older(a, b), Older(b, a))
	}
	p1, p2 := pull("3p1", "c1"), pull("3p1", "c2")
	if p1.Group() != p2.Group() || !Older(p1, p2) || p1.Key == p2.Key {
		t.Errorf("pull commits: groups %q %q, older %v", p1.Group(), p2.Group(), Older(p1, p2))
	}
	if !SupersededBy(a, b.Event) || SupersededBy(b, a.Event) || !SupersededBy(p1, p2.Event) || SupersededBy(a, dev.Event) {
		t.Error("SupersededBy disagrees with the queue's supersede")
	}
	finish := push("3k1", "refs/heads/main")
	finish.Workflow = &workflow.Workflow{Name: "ci", Superseded: "finish"}
	if SupersededBy(finish, b.Event) {
		t.Error("a workflow whose older runs finish is superseded")
	}
	// A re-run, a dispatch or a tick is a group of its own.
	again := New(rerunOf(a.Event, "did:plc:owner"), wf, nil, "c")
	tick := New(work.Event{Kind: forge.KindSchedule, URI: repo.URI, Repo: repo, Ref: "refs/heads/main",
		Control: work.Control{Workflows: map[string]int64{"ci": 1}, Tick: "2026-12-05T03:00:00Z"}}, wf, nil, "c")
	for _, j := range []*Job{again, tick} {
		if j.Group() == a.Group() || j.Group() == b.Group() || SupersededBy(j, b.Event) || SupersededBy(a, j.Event) {
			t.Errorf("%s: group %q supersedes or is superseded", j.Key, j.Group())
		}
	}
	if again.Key != forge.AttemptKey(a.Event.Subject(), "ci", 2) {
		t.Errorf("a re-run's job key %s, want attempt 2's", again.Key)
	}
}

// TestMirrorKey: a push's objects go into its repository's mirror, a
// pull's into its own, a batch's into the lander's.
func TestMirrorKey(t *testing.T) {
	t.Parallel()
	repo := forge.Record[forge.Repo]{URI: "at://did:plc:owner/dev.knotless.repo/r"}
	p := pullEvent("did:plc:a", "3p1", "c")
	p.Repo = repo
	push := pushEvent("did:plc:owner", "3k1")
	push.Repo = repo
	batch := work.Event{Kind: forge.KindBatch, Repo: repo}
	got := []string{MirrorKey(push), MirrorKey(p), MirrorKey(batch)}
	want := []string{string(repo.URI), "pull " + string(p.URI), "batch " + string(repo.URI)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mirror keys (-want +got):\n%s", diff)
	}
}

// TestSavedRoundTrip: what state.json keeps of a job reads back.
func TestSavedRoundTrip(t *testing.T) {
	t.Parallel()
	ev := pushEvent("did:plc:owner", "3k1")
	ev.Repo = forge.Record[forge.Repo]{URI: "at://did:plc:owner/dev.knotless.repo/r"}
	ev.Vars = []workflow.EnvVar{{Name: "A", Value: "b"}}
	ev = rerunOf(ev, "did:plc:owner")
	j := New(ev, &workflow.Workflow{Name: "ci"}, nil, "tree")
	j.Vars = []workflow.EnvVar{{Name: "INPUT", Value: "x"}, {Name: "A", Value: "b"}}
	b, err := Encode(j, forge.Check{Status: "running", Workflow: "ci"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Decode(b)
	if err != nil || s.Tree != "tree" || s.Check.Status != "running" || s.Event.Key() != ev.Key() || !slices.Equal(s.Event.Vars, ev.Vars) ||
		!slices.Equal(s.Vars, j.Vars) || s.Event.CheckKey("ci") != j.Key {
		t.Errorf("decoded %+v, %v", s, err)
	}
	if _, err := Decode([]byte("{")); err == nil {
		t.Error("a corrupt job decoded")
	}
}

// TestPathTriggerAndChangeRange: the path filters decide a push (from
// its ref update's old commit), a pull and its pre-flight (from the
// merge base with the base branch); a batch and run-control work
// are not filtered; a push that made its ref has no range.
func TestPathTriggerAndChangeRange(t *testing.T) {
	t.Parallel()
	push := pushEvent("did:plc:o", "3k1")
	push.Push = &forge.RefUpdate{Old: "a1", New: push.Commit}
	created := push
	created.Push = &forge.RefUpdate{Old: "0000000000000000000000000000000000000000", New: push.Commit}
	pull := pullEvent("did:plc:a", "3p1", "h1")
	pre := pull
	pre.Preflight = true
	type got struct {
		Trigger           workflow.Trigger
		Filtered          bool
		From, To          string
		MergeBase, Ranged bool
	}
	for _, c := range []struct {
		name string
		ev   work.Event
		want got
	}{
		{"push", push, got{workflow.Push, true, "a1", push.Commit, false, true}},
		{"push that made its ref", created, got{workflow.Push, true, "", "", false, false}},
		{"pull", pull, got{workflow.Pull, true, "base1", "h1", true, true}},
		{"pre-flight", pre, got{workflow.Pull, true, "base1", "h1", true, true}},
		{"batch", work.Event{Kind: forge.KindBatch}, got{}},
		{"re-run", rerunOf(push, "did:plc:o"), got{}},
	} {
		var g got
		g.Trigger, g.Filtered = PathTrigger(c.ev)
		if g.Filtered {
			g.From, g.To, g.MergeBase, g.Ranged = ChangeRange(c.ev, "base1")
		}
		if diff := cmp.Diff(c.want, g); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
	}
}
