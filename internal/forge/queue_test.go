package forge

import (
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"
)

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
