package mirror

import (
	"context"
	"errors"
	"strings"
	"testing"

	"knotless.dev/run/internal/rules/job"
)

// TestPortFetchKeepsTheOrigin: job's origin reaches the mirror as the
// same origin, which decides what a source may be (a pull's head.source
// is held to more than the owner's own source).
func TestPortFetchKeepsTheOrigin(t *testing.T) {
	t.Parallel()
	ms, err := New(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ms.Port(nil).Open(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	commit := strings.Repeat("a", 40)
	for _, c := range []struct {
		origin job.Origin
		want   string
	}{
		{job.OwnerSource, "repository source"},
		{job.PullSource, "pull head.source"},
	} {
		err := r.Fetch(context.Background(), c.origin, "ftp://example.org/x.git", "refs/heads/main", commit)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("fetch as %d: %v, want refused as a %s", c.origin, err, c.want)
		}
	}
}
