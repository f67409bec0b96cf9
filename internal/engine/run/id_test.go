package run

import (
	"regexp"
	"testing"
)

func TestNewID(t *testing.T) {
	t.Parallel()
	// A label value, a DNS label once prefixed (the Job's knotless-<id>)
	// and a Docker name.
	shape := regexp.MustCompile(`^r[a-z2-7]{16}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if !shape.MatchString(id) {
			t.Fatalf("NewID() = %q, want r and 16 lowercase base32 characters", id)
		}
		if seen[id] {
			t.Fatalf("NewID() returned %q twice", id)
		}
		seen[id] = true
	}
}
