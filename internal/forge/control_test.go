package forge

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	testRepo  = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello"
	testEvent = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.refUpdate/3n3pa7x34wk22"
)

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
		{CollectionCancel, Cancel{Type: CollectionCancel, Check: "zsvmur6bdrvdcvafwfoo7mmwp4", CreatedAt: Now()}},
		{CollectionCancel, Cancel{Type: CollectionCancel, Check: "zsvmur6bdrvdcvafwfoo7mmwp4", Runner: "did:plc:7u2ld3ffgzqvezmv6wxgxiix", Repo: testRepo, CreatedAt: Now()}},
		{CollectionRerun, Rerun{Type: CollectionRerun, Check: "zsvmur6bdrvdcvafwfoo7mmwp4", CreatedAt: Now()}},
		{CollectionRerun, Rerun{Type: CollectionRerun, Check: "zsvmur6bdrvdcvafwfoo7mmwp4", Repo: testRepo, Failed: true,
			Env: []Variable{{"DEBUG", "1"}, {"EMPTY", ""}}, CreatedAt: Now()}},
		{CollectionDispatch, Dispatch{Type: CollectionDispatch, Repo: testRepo, Ref: "refs/heads/main", Workflow: "deploy",
			Inputs: []Variable{{"target", "staging"}}, CreatedAt: Now()}},
		{CollectionCheck, Check{Type: CollectionCheck, Workflow: "build", Status: "cancelled", CreatedAt: Now(), Attempt: 2,
			Cause:       "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.rerun/3n3pa7x34wk22",
			CancelledBy: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.cancel/zsvmur6bdrvdcvafwfoo7mmwp4",
			Subject:     Subject{Repo: testRepo, Commit: commit, Event: testEvent, Kind: KindPush}}},
		{CollectionCheck, Check{Type: CollectionCheck, Workflow: "nightly", Status: "queued", CreatedAt: Now(),
			Subject: Subject{Repo: testRepo, Commit: commit, Ref: "refs/heads/main", Event: testRepo, Kind: KindSchedule, Tick: "2026-12-05T03:00:00Z"}}},
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
		{"cancel without check", CollectionCancel, `{"$type":"dev.knotless.cancel",` + at + `}`},
		{"cancel runner not a DID", CollectionCancel, `{"$type":"dev.knotless.cancel","check":"k","runner":"bob",` + at + `}`},
		{"rerun repo not an AT-URI", CollectionRerun, `{"$type":"dev.knotless.rerun","check":"k","repo":"hello",` + at + `}`},
		{"rerun env not name/value", CollectionRerun, `{"$type":"dev.knotless.rerun","check":"k","env":[{"name":"A"}],` + at + `}`},
		{"rerun failed not a boolean", CollectionRerun, `{"$type":"dev.knotless.rerun","check":"k","failed":"yes",` + at + `}`},
		{"dispatch without workflow", CollectionDispatch, `{"$type":"dev.knotless.dispatch","repo":"` + testRepo + `","ref":"refs/heads/main",` + at + `}`},
		{"dispatch without repo", CollectionDispatch, `{"$type":"dev.knotless.dispatch","ref":"refs/heads/main","workflow":"w",` + at + `}`},
		{"check attempt 0", CollectionCheck, `{"$type":"dev.knotless.check","workflow":"w","status":"queued","attempt":0,"subject":{"repo":"` + testRepo + `","commit":"` + commit + `","event":"` + testEvent + `","kind":"push"},` + at + `}`},
		{"check cause not an AT-URI", CollectionCheck, `{"$type":"dev.knotless.check","workflow":"w","status":"queued","cause":"rerun","subject":{"repo":"` + testRepo + `","commit":"` + commit + `","event":"` + testEvent + `","kind":"push"},` + at + `}`},
	}
	for _, b := range bad {
		if err := cat.Validate(b.coll, []byte(b.json)); err == nil {
			t.Errorf("%s: validated", b.name)
		}
	}
}

// TestAttemptKeyVector pins the keys of the new kinds and attempts as
// docs/design/protocol.md states them; the first attempt of a push keeps
// TestCheckKeyVector's key.
func TestAttemptKeyVector(t *testing.T) {
	t.Parallel()
	push := Subject{Kind: KindPush, Event: testEvent, Commit: strings.Repeat("a", 40)}
	dispatch := Subject{Kind: KindDispatch, Event: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.dispatch/3n3pa7x34wk22", Commit: strings.Repeat("a", 40)}
	schedule := Subject{Kind: KindSchedule, Repo: testRepo, Event: testRepo, Tick: "2026-12-05T03:00:00Z", Commit: strings.Repeat("a", 40)}
	for _, v := range []struct {
		name    string
		s       Subject
		attempt int64
		want    string
	}{
		{"push, first attempt", push, 1, "zsvmur6bdrvdcvafwfoo7mmwp4"},
		{"push, attempt 0 is the first", push, 0, "zsvmur6bdrvdcvafwfoo7mmwp4"},
		{"push, second attempt", push, 2, "jptbmr3jxfidphsx6tri5pdqdy"},
		{"push, third attempt", push, 3, "27mu3y7nvt5xytduiln4qvhgt4"},
		{"dispatch", dispatch, 1, "b2ubidlhmwlhjd47mltfykzd5u"},
		{"schedule", schedule, 1, "jcsiux3dgtvvxx7kfmnmcyuz3u"},
	} {
		if diff := cmp.Diff(v.want, AttemptKey(v.s, "lint", v.attempt)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", v.name, diff)
		}
	}
	if diff := cmp.Diff("gornu452x7qj5jqkhpybc7dgwq", CancelKey("did:plc:7u2ld3ffgzqvezmv6wxgxiix", "zsvmur6bdrvdcvafwfoo7mmwp4")); diff != "" {
		t.Errorf("cancel key (-want +got):\n%s", diff)
	}
}

// TestCheckKeyOfDispatchAndSchedule: a dispatch's key does not move with
// its ref's head, nor a schedule's with the default branch's; a
// schedule's moves with the tick; no attempt shares another's key.
func TestCheckKeyOfDispatchAndSchedule(t *testing.T) {
	t.Parallel()
	d := Subject{Kind: KindDispatch, Event: "at://did:plc:o/dev.knotless.dispatch/3n3pa7x34wk22", Commit: strings.Repeat("a", 40)}
	d2 := d
	d2.Commit = strings.Repeat("b", 40)
	if CheckKey(d, "w") != CheckKey(d2, "w") {
		t.Error("a dispatch's key moves with the commit")
	}
	s := Subject{Kind: KindSchedule, Repo: testRepo, Event: testRepo, Tick: "2026-12-05T03:00:00Z", Commit: strings.Repeat("a", 40)}
	s2 := s
	s2.Commit = strings.Repeat("b", 40)
	if CheckKey(s, "w") != CheckKey(s2, "w") {
		t.Error("a schedule's key moves with the commit")
	}
	s3 := s
	s3.Tick = "2026-12-06T03:00:00Z"
	if CheckKey(s, "w") == CheckKey(s3, "w") {
		t.Error("two ticks share a key")
	}
	seen := map[string]int64{}
	for a := int64(1); a <= 50; a++ {
		k := AttemptKey(d, "w", a)
		if prev, ok := seen[k]; ok {
			t.Errorf("attempts %d and %d share the key %s", prev, a, k)
		}
		seen[k] = a
	}
}
