package mirror

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// landFixture is an origin (a bare repository, pushed to over file://)
// with main at base, and a work repository holding four pulls: p1 adds
// b.txt, p2 adds another b.txt (conflicts with p1 only), p3 changes
// a.txt from before main moved (conflicts with the base), p4 adds d.txt.
type landFixture struct {
	origin, url, base string
	p1, p2, p3, p4    string
	m                 *Mirrors
	r                 *Repo
}

func newLandFixture(t *testing.T) landFixture {
	t.Helper()
	ctx := context.Background()
	var f landFixture
	work := t.TempDir()
	gitIn(t, work, "init", "--quiet", "--initial-branch=main")
	old := commitFiles(t, work, map[string]string{"a.txt": "one\n"})
	f.base = commitFiles(t, work, map[string]string{"a.txt": "main\n"})
	branch := func(name, from string, files map[string]string) string {
		gitIn(t, work, "checkout", "--quiet", "-b", name, from)
		return commitFiles(t, work, files)
	}
	f.p1 = branch("p1", f.base, map[string]string{"b.txt": "p1\n"})
	f.p2 = branch("p2", f.base, map[string]string{"b.txt": "p2\n"})
	f.p3 = branch("p3", old, map[string]string{"a.txt": "p3\n"})
	f.p4 = branch("p4", f.base, map[string]string{"d.txt": "p4\n"})
	f.origin = filepath.Join(t.TempDir(), "origin.git")
	gitIn(t, work, "init", "--quiet", "--bare", f.origin)
	gitIn(t, work, "push", "--quiet", f.origin, f.base+":refs/heads/main")
	f.url = "file://" + f.origin
	var err error
	f.m, err = New(t.TempDir(), Options{Policy: Policy{AllowLocal: true}})
	if err != nil {
		t.Fatal(err)
	}
	f.r, err = f.m.Open(ctx, "batch")
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []string{f.p1, f.p2, f.p3, f.p4} {
		if err := f.r.Fetch(ctx, Pull, "file://"+work, "refs/heads/p"+string(rune('1'+i)), c); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := f.r.Branch(ctx, f.url, "main"); err != nil || got != f.base {
		t.Fatalf("branch: %s, %v", got, err)
	}
	return f
}

var lander = Identity{Name: "knotless lander", Email: "lander@knotless.invalid"}

func TestSquash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newLandFixture(t)
	pulls := []SquashPull{{Head: f.p1, Message: "one"}, {Head: f.p2, Message: "two"}, {Head: f.p3, Message: "three"}, {Head: f.p4, Message: "four"}}
	at := time.Unix(1767225600, 0)
	tip, got, err := f.r.Squash(ctx, f.base, pulls, lander, at)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Commit == "" || got[3].Commit != tip {
		t.Fatalf("squashed: %+v, tip %s", got, tip)
	}
	want := []Squashed{
		{Head: f.p1, Commit: got[0].Commit, Changed: []string{"b.txt"}},
		{Head: f.p2, Conflicts: []string{"b.txt"}},
		{Head: f.p3, Conflicts: []string{"a.txt"}, ConflictsWithBase: true},
		{Head: f.p4, Commit: tip, Changed: []string{"d.txt"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("squash (-want +got):\n%s", diff)
	}
	if parents, _ := f.r.git(ctx, "rev-list", "--parents", "-n1", tip); strings.TrimSpace(parents) != tip+" "+got[0].Commit {
		t.Errorf("tip's parents: %q, want only p1's squashed commit", parents)
	}
	if msg, _ := f.r.git(ctx, "log", "-1", "--format=%an <%ae> %s", tip); strings.TrimSpace(msg) != "knotless lander <lander@knotless.invalid> four" {
		t.Errorf("tip: %q", msg)
	}
	again, _, err := f.r.Squash(ctx, f.base, pulls, lander, at)
	if err != nil || again != tip {
		t.Errorf("squashing again: %s, %v; want the same commit %s", again, err, tip)
	}
	if _, _, err := f.r.Squash(ctx, f.base, []SquashPull{{Head: "HEAD", Message: ""}}, lander, at); !errors.Is(err, ErrRefused) {
		t.Errorf("squash of a non-id: %v, want refused", err)
	}
}

func TestPush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newLandFixture(t)
	tip, _, err := f.r.Squash(ctx, f.base, []SquashPull{{Head: f.p1, Message: "one"}}, lander, time.Unix(1767225600, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.r.Push(ctx, f.url, "main", f.base, f.p3, nil); err == nil || errors.Is(err, ErrBaseMoved) {
		t.Errorf("push of a commit that does not descend from the base: %v", err)
	}
	if err := f.r.Push(ctx, f.url, "main", f.base, tip, nil); err != nil {
		t.Fatal(err)
	}
	if got := gitIn(t, f.origin, "rev-parse", "refs/heads/main"); got != tip {
		t.Errorf("origin main: %s, want %s", got, tip)
	}
	// The base moved (to tip): a batch built on the old base is not
	// pushed, and nothing is forced.
	tip2, _, err := f.r.Squash(ctx, f.base, []SquashPull{{Head: f.p4, Message: "four"}}, lander, time.Unix(1767225600, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.r.Push(ctx, f.url, "main", f.base, tip2, nil); !errors.Is(err, ErrBaseMoved) {
		t.Errorf("push over a moved base: %v, want ErrBaseMoved", err)
	}
	if got := gitIn(t, f.origin, "rev-parse", "refs/heads/main"); got != tip {
		t.Errorf("origin main: %s, want still %s", got, tip)
	}
}

// A conflict names its paths as they are, not C-quoted (git's
// core.quotePath): the same names the squash lists as changed, so the
// queue finds the earlier pull a conflict is with, and a path of
// multi-byte characters reads as written.
func TestSquashNamesPathsAsTheyAre(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	work := t.TempDir()
	gitIn(t, work, "init", "--quiet", "--initial-branch=main")
	base := commitFiles(t, work, map[string]string{"a.txt": "a\n"})
	const path = "répertoire/日本語 \"x\".txt"
	gitIn(t, work, "checkout", "--quiet", "-b", "p1", base)
	p1 := commitFiles(t, work, map[string]string{path: "one\n"})
	gitIn(t, work, "checkout", "--quiet", "-b", "p2", base)
	p2 := commitFiles(t, work, map[string]string{path: "two\n"})
	m, err := New(t.TempDir(), Options{Policy: Policy{AllowLocal: true}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Open(ctx, "batch")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ ref, commit string }{{"refs/heads/p1", p1}, {"refs/heads/p2", p2}} {
		if err := r.Fetch(ctx, Pull, "file://"+work, c.ref, c.commit); err != nil {
			t.Fatal(err)
		}
	}
	tip, got, err := r.Squash(ctx, base, []SquashPull{{Head: p1, Message: "one"}, {Head: p2, Message: "two"}}, lander, time.Unix(1767225600, 0))
	if err != nil {
		t.Fatal(err)
	}
	want := []Squashed{{Head: p1, Commit: tip, Changed: []string{path}}, {Head: p2, Conflicts: []string{path}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("squash (-want +got):\n%s", diff)
	}
	_, err = r.Merge(ctx, tip, p2)
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Detail != "conflicting paths: "+path {
		t.Errorf("merge: %v; want a conflict naming %q", err, path)
	}
}
