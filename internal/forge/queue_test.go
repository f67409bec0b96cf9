package forge

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"
)

func TestQueueRecordsValidate(t *testing.T) {
	t.Parallel()
	cat, err := NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	repo := "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello"
	pull := "at://did:plc:7u2ld3ffgzqvezmv6wxgxiix/dev.knotless.pull/3n3pa7x34wk22"
	batch := "at://did:plc:7u2ld3ffgzqvezmv6wxgxiix/dev.knotless.batch/abc"
	a, b := strings.Repeat("a", 40), strings.Repeat("b", 40)
	good := []struct {
		coll string
		v    any
	}{
		{CollectionRepo, Repo{Type: CollectionRepo, Name: "hello", Source: "file:///srv/hello", Runners: []string{"did:plc:ewvi7nxzyoun6zhxrhs64oiz"},
			Landers: []string{"did:plc:ewvi7nxzyoun6zhxrhs64oiz"}, CreatedAt: Now()}},
		{CollectionQueueEntry, QueueEntry{Type: CollectionQueueEntry, Repo: repo, Pull: pull, Commit: a, Base: "main", CreatedAt: Now()}},
		// An entry written before entries named a base still reads, so
		// that the lander can eject it (noBase) instead of ignoring it.
		{CollectionQueueEntry, QueueEntry{Type: CollectionQueueEntry, Repo: repo, Pull: pull, Commit: a, CreatedAt: Now()}},
		{CollectionBatch, Batch{Type: CollectionBatch, Repo: repo, Ref: "refs/heads/main", Base: a, Pulls: []BatchPull{{Pull: pull, Commit: b}},
			Squashed: b, Status: BatchLanded, CreatedAt: Now()}},
		{CollectionEjection, Ejection{Type: CollectionEjection, Repo: repo, Pull: pull, Commit: a, Reason: EjectConflictBase, Detail: "a.txt", Batch: batch, CreatedAt: Now()}},
		{CollectionLanding, Landing{Type: CollectionLanding, Repo: repo, Ref: "refs/heads/main", Old: a, New: b, Batch: batch, CreatedAt: Now()}},
	}
	for _, g := range good {
		m, err := cat.Encode(g.coll, g.v)
		if err != nil {
			t.Errorf("%s: %v", g.coll, err)
			continue
		}
		raw, _ := json.Marshal(m)
		if err := cat.Validate(g.coll, raw); err != nil {
			t.Errorf("%s round trip: %v", g.coll, err)
		}
	}
	bad := []struct {
		name, coll string
		v          any
	}{
		{"lander not a DID", CollectionRepo, Repo{Type: CollectionRepo, Name: "x", Source: "y", Landers: []string{"bob"}, CreatedAt: Now()}},
		{"entry without commit", CollectionQueueEntry, QueueEntry{Type: CollectionQueueEntry, Repo: repo, Pull: pull, CreatedAt: Now()}},
		{"entry base too long", CollectionQueueEntry, QueueEntry{Type: CollectionQueueEntry, Repo: repo, Pull: pull, Commit: a, Base: strings.Repeat("b", 256), CreatedAt: Now()}},
		{"entry pull not an AT-URI", CollectionQueueEntry, QueueEntry{Type: CollectionQueueEntry, Repo: repo, Pull: "42", Commit: a, CreatedAt: Now()}},
		{"batch without pulls", CollectionBatch, Batch{Type: CollectionBatch, Repo: repo, Ref: "refs/heads/main", Base: a, Status: BatchBuilding, CreatedAt: Now()}},
		{"batch short base", CollectionBatch, Batch{Type: CollectionBatch, Repo: repo, Ref: "refs/heads/main", Base: "abc", Pulls: []BatchPull{{Pull: pull, Commit: b}}, Status: BatchBuilding, CreatedAt: Now()}},
		{"ejection without reason", CollectionEjection, Ejection{Type: CollectionEjection, Repo: repo, Pull: pull, Commit: a, CreatedAt: Now()}},
		{"landing without old", CollectionLanding, Landing{Type: CollectionLanding, Repo: repo, Ref: "refs/heads/main", New: b, Batch: batch, CreatedAt: Now()}},
		{"wrong type", CollectionLanding, Landing{Type: CollectionBatch, Repo: repo, Ref: "refs/heads/main", Old: a, New: b, Batch: batch, CreatedAt: Now()}},
	}
	for _, c := range bad {
		if _, err := cat.Encode(c.coll, c.v); err == nil {
			t.Errorf("%s: validated", c.name)
		}
	}
}

func TestLander(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name             string
		runners, landers []string
		want             string
	}{
		{"none named", nil, []string{"did:a"}, ""},
		{"no landers: first named", []string{"did:a", "did:b"}, nil, "did:a"},
		{"first named that may push", []string{"did:a", "did:b", "did:c"}, []string{"did:c", "did:b"}, "did:b"},
		{"lander not named: first named", []string{"did:a", "did:b"}, []string{"did:z"}, "did:a"},
	} {
		r := Repo{Runners: c.runners, Landers: c.landers}
		if diff := cmp.Diff(c.want, r.Lander()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
	}
}

func TestQueueKeys(t *testing.T) {
	t.Parallel()
	a, b := strings.Repeat("a", 40), strings.Repeat("b", 40)
	p1 := []BatchPull{{Pull: "at://x/p/1", Commit: a}, {Pull: "at://x/p/2", Commit: b}}
	p2 := []BatchPull{p1[1], p1[0]}
	k := BatchKey("r", a, p1)
	if k != BatchKey("r", a, p1) || len(k) != 26 {
		t.Errorf("batch key %q: want stable, 26 characters", k)
	}
	if k == BatchKey("r", a, p2) || k == BatchKey("r", b, p1) || k == BatchKey("r", a, p1[:1]) {
		t.Error("batch key ignores order, base or pulls")
	}
	if EjectionKey("p", a) == EjectionKey("p", b) {
		t.Error("ejection key ignores the commit")
	}
	l1, err := LandingKey(k, "2026-01-01T00:00:00.000Z")
	if err != nil {
		t.Fatal(err)
	}
	l2, _ := LandingKey(k, "2026-01-01T00:00:00.000Z")
	l3, _ := LandingKey(k, "2026-01-01T00:00:01.000Z")
	tid, err := syntax.ParseTID(l1)
	if err != nil || l1 != l2 || l1 >= l3 || tid.Time().Unix() != 1767225600 {
		t.Errorf("landing keys %s %s %s (%v): want the same TID of the batch's time, later for a later batch", l1, l2, l3, err)
	}
	if _, err := LandingKey(k, "yesterday"); err == nil {
		t.Error("landing key of a bad time")
	}
}
