package mirror

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestChanged: the paths a push changed (before..after) and a pull
// (from its merge base with the base branch, whatever the base did
// since), as the source names them, renames as two paths.
func TestChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := t.TempDir()
	gitIn(t, src, "init", "--quiet", "--initial-branch=main")
	base := commitFiles(t, src, map[string]string{"a.txt": "one\n", "docs/old.md": "x\n"})
	gitIn(t, src, "mv", "docs/old.md", "docs/new.md")
	after := commitFiles(t, src, map[string]string{"docs/deep/b c\n.md": "odd name\n"})
	gitIn(t, src, "checkout", "--quiet", "-b", "pull", base)
	head := commitFiles(t, src, map[string]string{"src/x.go": "package x\n"})
	gitIn(t, src, "checkout", "--quiet", "main")

	m, err := New(t.TempDir(), Options{Policy: Policy{AllowLocal: true}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Open(ctx, "at://did:plc:x/dev.knotless.repo/hello")
	if err != nil {
		t.Fatal(err)
	}
	url := "file://" + src
	for ref, c := range map[string]string{"refs/heads/main": after, "refs/heads/pull": head} {
		if err := r.Fetch(ctx, Owner, url, ref, c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := r.Changed(ctx, base, after, false)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"docs/deep/b c\n.md", "docs/new.md", "docs/old.md"}, got); diff != "" {
		t.Errorf("push (-want +got):\n%s", diff)
	}
	// main moved on since the pull left it: only the pull's own change.
	got, err = r.Changed(ctx, after, head, true)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"src/x.go"}, got); diff != "" {
		t.Errorf("pull (-want +got):\n%s", diff)
	}
	if _, err := r.Changed(ctx, "--output=/tmp/x", head, false); !errors.Is(err, ErrRefused) {
		t.Errorf("an option for a commit: %v, want refused", err)
	}
	if _, err := r.Changed(ctx, strings.Repeat("1", 40), head, false); err == nil {
		t.Error("a commit the mirror lacks: no error")
	}
}
