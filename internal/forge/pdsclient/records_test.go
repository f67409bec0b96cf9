package pdsclient

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atdata"

	"knotless.dev/run/internal/forge"
)

const (
	testRepo  = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello"
	testEvent = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.refUpdate/3n3pa7x34wk22"
)

func TestRecordsValidate(t *testing.T) {
	t.Parallel()
	cat, err := NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	commit := strings.Repeat("a", 40)
	code := int64(3)
	good := []struct {
		coll string
		v    any
	}{
		{forge.CollectionRepo, forge.Repo{Type: forge.CollectionRepo, Name: "hello", Source: "file:///srv/hello", Runners: []string{"did:plc:ewvi7nxzyoun6zhxrhs64oiz"}, CreatedAt: forge.Now()}},
		{forge.CollectionRefUpdate, forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello", Ref: "refs/heads/main", New: commit, CreatedAt: forge.Now()}},
		{forge.CollectionPull, forge.Pull{Type: forge.CollectionPull, Repo: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello", Base: "main",
			Head: forge.PullHead{Source: "https://example.com/fork.git", Ref: "refs/heads/x", Commit: commit}, Title: "x", State: forge.PullOpen, CreatedAt: forge.Now()}},
		{forge.CollectionCheck, forge.Check{Type: forge.CollectionCheck, Workflow: "build", Status: "failure", FailedStep: "test", CreatedAt: forge.Now(),
			Subject: forge.Subject{Repo: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello", Commit: commit, Event: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.refUpdate/3n3pa7x34wk22", Kind: forge.KindPush},
			Steps:   []forge.CheckStep{{Name: "test", Status: "failure", ExitCode: &code, DurationMs: 12}}}},
		{forge.CollectionSecret, forge.Secret{Type: forge.CollectionSecret, Repo: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello", Name: "TOKEN",
			Runner: "did:plc:7u2ld3ffgzqvezmv6wxgxiix", Scope: forge.ScopePush, Sealed: atdata.Bytes("sealed"), CreatedAt: forge.Now()}},
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
		name, coll, json string
	}{
		{"wrong type", forge.CollectionRepo, `{"$type":"dev.knotless.pull","name":"x","source":"y","createdAt":"2024-01-01T00:00:00Z"}`},
		{"missing source", forge.CollectionRepo, `{"$type":"dev.knotless.repo","name":"x","createdAt":"2024-01-01T00:00:00Z"}`},
		{"runner not a DID", forge.CollectionRepo, `{"$type":"dev.knotless.repo","name":"x","source":"y","runners":["bob"],"createdAt":"2024-01-01T00:00:00Z"}`},
		{"short commit", forge.CollectionRefUpdate, `{"$type":"dev.knotless.refUpdate","repo":"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello","ref":"main","new":"abc","createdAt":"2024-01-01T00:00:00Z"}`},
		{"repo not an AT-URI", forge.CollectionRefUpdate, `{"$type":"dev.knotless.refUpdate","repo":"hello","ref":"main","new":"` + commit + `","createdAt":"2024-01-01T00:00:00Z"}`},
	}
	for _, b := range bad {
		if err := cat.Validate(b.coll, []byte(b.json)); err == nil {
			t.Errorf("%s: validated", b.name)
		}
	}
}

// TestControlRecordsValidate: the cancel, rerun and dispatch records and
// the check's new fields round-trip through their lexicons, and what
// breaks them is refused.
func TestControlRecordsValidate(t *testing.T) {
	t.Parallel()
	cat, err := NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	commit := strings.Repeat("a", 40)
	good := []struct {
		coll string
		v    any
	}{
		{forge.CollectionCancel, forge.Cancel{Type: forge.CollectionCancel, Check: "zsvmur6bdrvdcvafwfoo7mmwp4", CreatedAt: forge.Now()}},
		{forge.CollectionCancel, forge.Cancel{Type: forge.CollectionCancel, Check: "zsvmur6bdrvdcvafwfoo7mmwp4", Runner: "did:plc:7u2ld3ffgzqvezmv6wxgxiix", Repo: testRepo, CreatedAt: forge.Now()}},
		{forge.CollectionRerun, forge.Rerun{Type: forge.CollectionRerun, Check: "zsvmur6bdrvdcvafwfoo7mmwp4", CreatedAt: forge.Now()}},
		{forge.CollectionRerun, forge.Rerun{Type: forge.CollectionRerun, Check: "zsvmur6bdrvdcvafwfoo7mmwp4", Repo: testRepo, Failed: true,
			Env: []forge.Variable{{Name: "DEBUG", Value: "1"}, {Name: "EMPTY", Value: ""}}, CreatedAt: forge.Now()}},
		{forge.CollectionDispatch, forge.Dispatch{Type: forge.CollectionDispatch, Repo: testRepo, Ref: "refs/heads/main", Workflow: "deploy",
			Inputs: []forge.Variable{{Name: "target", Value: "staging"}}, CreatedAt: forge.Now()}},
		{forge.CollectionCheck, forge.Check{Type: forge.CollectionCheck, Workflow: "build", Status: "cancelled", CreatedAt: forge.Now(), Attempt: 2,
			Cause:       "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.rerun/3n3pa7x34wk22",
			CancelledBy: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.cancel/zsvmur6bdrvdcvafwfoo7mmwp4",
			Subject:     forge.Subject{Repo: testRepo, Commit: commit, Event: testEvent, Kind: forge.KindPush}}},
		{forge.CollectionCheck, forge.Check{Type: forge.CollectionCheck, Workflow: "nightly", Status: "queued", CreatedAt: forge.Now(),
			Subject: forge.Subject{Repo: testRepo, Commit: commit, Ref: "refs/heads/main", Event: testRepo, Kind: forge.KindSchedule, Tick: "2026-12-05T03:00:00Z"}}},
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
	const at = `"createdAt":"2026-01-01T00:00:00Z"`
	bad := []struct {
		name, coll, json string
	}{
		{"cancel without check", forge.CollectionCancel, `{"$type":"dev.knotless.cancel",` + at + `}`},
		{"cancel runner not a DID", forge.CollectionCancel, `{"$type":"dev.knotless.cancel","check":"k","runner":"bob",` + at + `}`},
		{"rerun repo not an AT-URI", forge.CollectionRerun, `{"$type":"dev.knotless.rerun","check":"k","repo":"hello",` + at + `}`},
		{"rerun env not name/value", forge.CollectionRerun, `{"$type":"dev.knotless.rerun","check":"k","env":[{"name":"A"}],` + at + `}`},
		{"rerun failed not a boolean", forge.CollectionRerun, `{"$type":"dev.knotless.rerun","check":"k","failed":"yes",` + at + `}`},
		{"dispatch without workflow", forge.CollectionDispatch, `{"$type":"dev.knotless.dispatch","repo":"` + testRepo + `","ref":"refs/heads/main",` + at + `}`},
		{"dispatch without repo", forge.CollectionDispatch, `{"$type":"dev.knotless.dispatch","ref":"refs/heads/main","workflow":"w",` + at + `}`},
		{"check attempt 0", forge.CollectionCheck, `{"$type":"dev.knotless.check","workflow":"w","status":"queued","attempt":0,"subject":{"repo":"` + testRepo + `","commit":"` + commit + `","event":"` + testEvent + `","kind":"push"},` + at + `}`},
		{"check cause not an AT-URI", forge.CollectionCheck, `{"$type":"dev.knotless.check","workflow":"w","status":"queued","cause":"rerun","subject":{"repo":"` + testRepo + `","commit":"` + commit + `","event":"` + testEvent + `","kind":"push"},` + at + `}`},
	}
	for _, b := range bad {
		if err := cat.Validate(b.coll, []byte(b.json)); err == nil {
			t.Errorf("%s: validated", b.name)
		}
	}
}

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
		{forge.CollectionRepo, forge.Repo{Type: forge.CollectionRepo, Name: "hello", Source: "file:///srv/hello", Runners: []string{"did:plc:ewvi7nxzyoun6zhxrhs64oiz"},
			Landers: []string{"did:plc:ewvi7nxzyoun6zhxrhs64oiz"}, CreatedAt: forge.Now()}},
		{forge.CollectionQueueEntry, forge.QueueEntry{Type: forge.CollectionQueueEntry, Repo: repo, Pull: pull, Commit: a, Base: "main", CreatedAt: forge.Now()}},
		// An entry written before entries named a base still reads, so
		// that the lander can eject it (noBase) instead of ignoring it.
		{forge.CollectionQueueEntry, forge.QueueEntry{Type: forge.CollectionQueueEntry, Repo: repo, Pull: pull, Commit: a, CreatedAt: forge.Now()}},
		{forge.CollectionBatch, forge.Batch{Type: forge.CollectionBatch, Repo: repo, Ref: "refs/heads/main", Base: a, Pulls: []forge.BatchPull{{Pull: pull, Commit: b}},
			Squashed: b, Status: forge.BatchLanded, CreatedAt: forge.Now()}},
		{forge.CollectionEjection, forge.Ejection{Type: forge.CollectionEjection, Repo: repo, Pull: pull, Commit: a, Reason: forge.EjectConflictBase, Detail: "a.txt", Batch: batch, CreatedAt: forge.Now()}},
		{forge.CollectionLanding, forge.Landing{Type: forge.CollectionLanding, Repo: repo, Ref: "refs/heads/main", Old: a, New: b, Batch: batch, CreatedAt: forge.Now()}},
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
		{"lander not a DID", forge.CollectionRepo, forge.Repo{Type: forge.CollectionRepo, Name: "x", Source: "y", Landers: []string{"bob"}, CreatedAt: forge.Now()}},
		{"entry without commit", forge.CollectionQueueEntry, forge.QueueEntry{Type: forge.CollectionQueueEntry, Repo: repo, Pull: pull, CreatedAt: forge.Now()}},
		{"entry base too long", forge.CollectionQueueEntry, forge.QueueEntry{Type: forge.CollectionQueueEntry, Repo: repo, Pull: pull, Commit: a, Base: strings.Repeat("b", 256), CreatedAt: forge.Now()}},
		{"entry pull not an AT-URI", forge.CollectionQueueEntry, forge.QueueEntry{Type: forge.CollectionQueueEntry, Repo: repo, Pull: "42", Commit: a, CreatedAt: forge.Now()}},
		{"batch without pulls", forge.CollectionBatch, forge.Batch{Type: forge.CollectionBatch, Repo: repo, Ref: "refs/heads/main", Base: a, Status: forge.BatchBuilding, CreatedAt: forge.Now()}},
		{"batch short base", forge.CollectionBatch, forge.Batch{Type: forge.CollectionBatch, Repo: repo, Ref: "refs/heads/main", Base: "abc", Pulls: []forge.BatchPull{{Pull: pull, Commit: b}}, Status: forge.BatchBuilding, CreatedAt: forge.Now()}},
		{"ejection without reason", forge.CollectionEjection, forge.Ejection{Type: forge.CollectionEjection, Repo: repo, Pull: pull, Commit: a, CreatedAt: forge.Now()}},
		{"landing without old", forge.CollectionLanding, forge.Landing{Type: forge.CollectionLanding, Repo: repo, Ref: "refs/heads/main", New: b, Batch: batch, CreatedAt: forge.Now()}},
		{"wrong type", forge.CollectionLanding, forge.Landing{Type: forge.CollectionBatch, Repo: repo, Ref: "refs/heads/main", Old: a, New: b, Batch: batch, CreatedAt: forge.Now()}},
	}
	for _, c := range bad {
		if _, err := cat.Encode(c.coll, c.v); err == nil {
			t.Errorf("%s: validated", c.name)
		}
	}
}
