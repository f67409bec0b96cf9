package forge

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	testRepo  = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello"
	testEvent = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.refUpdate/3n3pa7x34wk22"
)

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
