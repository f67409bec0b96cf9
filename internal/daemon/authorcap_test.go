package daemon

import (
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
)

func pullEvent(author, rkey, commit string) ingest.Event {
	return ingest.Event{Kind: forge.KindPull, URI: syntax.ATURI("at://" + author + "/" + forge.CollectionPull + "/" + rkey), Commit: commit}
}

func pushEvent(owner, rkey string) ingest.Event {
	return ingest.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://" + owner + "/" + forge.CollectionRefUpdate + "/" + rkey), Commit: "c" + rkey, Trusted: true}
}

// TestAuthor: whom the author caps count an event, and a check write,
// against: a pull's author; a push's owner only when the limits apply
// to all runs; a batch never.
func TestAuthor(t *testing.T) {
	t.Parallel()
	const spam, owner = "did:plc:spam", "did:plc:owner"
	p := pullEvent(spam, "p1", "a")
	p.Repo.URI = syntax.ATURI("at://" + owner + "/" + forge.CollectionRepo + "/r")
	pre := p
	pre.Preflight = true
	push := pushEvent(owner, "r1")
	push.Repo.URI = p.Repo.URI
	landing := ingest.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://did:plc:lander/" + forge.CollectionLanding + "/l1"),
		Repo: p.Repo, Trusted: true}
	batch := ingest.Event{Kind: forge.KindBatch, URI: syntax.ATURI("at://did:plc:lander/" + forge.CollectionBatch + "/b1"), Repo: p.Repo}
	for _, tc := range []struct {
		name string
		ev   ingest.Event
		all  bool
		want string
	}{
		{"a pull", p, false, spam},
		{"a pre-flight", pre, false, spam},
		{"the owner's push", push, false, ""},
		{"the owner's push, limits on all", push, true, owner},
		{"a landing, limits on all", landing, true, owner},
		{"a batch", batch, true, ""},
	} {
		if got := author(tc.ev, tc.all); got != tc.want {
			t.Errorf("%s: author %q, want %q", tc.name, got, tc.want)
		}
		c := forge.Check{Subject: tc.ev.Subject()}
		if got := checkAuthor(c, tc.all); got != tc.want {
			t.Errorf("%s: its check's author %q, want %q, as its event's", tc.name, got, tc.want)
		}
	}
}

// TestQueueLoad is what an author has in hand as the caps count it:
// runs, not pulls (each workflow of each commit is one), without the
// older commit's runs of the pull being considered (it supersedes them)
// unless they finish; and the writes they all still owe (2 a queued
// run, 1 a running one).
func TestQueueLoad(t *testing.T) {
	t.Parallel()
	const spam, other = "did:plc:spam", "did:plc:other"
	q := newQueue()
	for _, j := range []*job{
		pullJob(spam, "p1", "a", "lint"), pullJob(spam, "p1", "a", "test"),
		pullJob(spam, "p2", "b", "lint"), pullJob(other, "q1", "c", "lint"),
		pushJob("r1", "main", "ci"),
	} {
		q.add(j)
	}
	q.claim() // the push
	q.claim() // p1's lint
	finish := pullJob(spam, "p3", "d", "deploy")
	finish.wf.Superseded = "finish"
	q.add(finish)
	for _, tc := range []struct {
		name      string
		a         string
		all       bool
		ev        ingest.Event
		wantRuns  int
		wantOwing int
	}{
		{"a new pull", spam, false, pullEvent(spam, "p9", "z"), 4, 1 + 2 + 2 + 2},
		{"a newer commit of p1", spam, false, pullEvent(spam, "p1", "a2"), 2, 7},
		{"the same commit of p1", spam, false, pullEvent(spam, "p1", "a"), 4, 7},
		{"a newer commit of a pull whose runs finish", spam, false, pullEvent(spam, "p3", "d2"), 4, 7},
		{"another author", other, false, pullEvent(other, "q2", "y"), 1, 2},
		{"the owner's pushes, limits on all", "did:plc:owner", true, pushEvent("did:plc:owner", "r0"), 1, 1},
		{"the owner's newer push of main, limits on all", "did:plc:owner", true, func() ingest.Event {
			ev := pushJob("r2", "main", "ci").ev
			return ev
		}(), 0, 1},
	} {
		runs, owing := q.load(tc.a, tc.all, tc.ev)
		if runs != tc.wantRuns || owing != tc.wantOwing {
			t.Errorf("%s: load %d runs, %d owed; want %d, %d", tc.name, runs, owing, tc.wantRuns, tc.wantOwing)
		}
	}
}

// TestClaimIndex: a worker takes the owner's push before strangers'
// pulls queued ahead of it, else the oldest job.
func TestClaimIndex(t *testing.T) {
	t.Parallel()
	q := []*job{{ev: pullEvent("did:plc:a", "p1", "a")}, {ev: pullEvent("did:plc:b", "p2", "b")}, {ev: pushEvent("did:plc:o", "r1")}, {ev: pushEvent("did:plc:o", "r2")}}
	if got := claimIndex(q); got != 2 {
		t.Errorf("claimIndex = %d, want 2 (the first push)", got)
	}
	if got := claimIndex(q[:2]); got != 0 {
		t.Errorf("pulls only: claimIndex = %d, want 0", got)
	}
}
