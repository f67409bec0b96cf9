// Package gitrepo is a real git repository in a test's temporary
// directory: the source a test repository record names (file://).
package gitrepo

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Repo is a git repository with a main branch.
type Repo struct {
	t   testing.TB
	Dir string
}

// New makes an empty repository in a new temporary directory, readable
// by everyone (a daemon under test may read it as another user).
func New(t testing.TB) *Repo {
	t.Helper()
	r := &Repo{t: t, Dir: t.TempDir()}
	if err := os.Chmod(r.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r.Git("init", "--quiet", "--initial-branch=main")
	return r
}

// Git runs git in the repository and returns its trimmed output; a
// failure fails the test.
func (r *Repo) Git(args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = r.Dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// Head returns the commit ref points at, or "" when it does not exist.
func (r *Repo) Head(ref string) string {
	out, err := exec.Command("git", "-C", r.Dir, "rev-parse", "--verify", "--quiet", ref).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Commit writes files (path to content) on branch, creating the branch
// when it is new, commits them (also when nothing changed) and returns
// the commit.
func (r *Repo) Commit(branch string, files map[string]string) string {
	r.t.Helper()
	if cur := r.Git("symbolic-ref", "--short", "HEAD"); cur != branch {
		if r.Head("refs/heads/"+branch) != "" {
			r.Git("checkout", "--quiet", branch)
		} else {
			r.Git("checkout", "--quiet", "-b", branch)
		}
	}
	for name, content := range files {
		p := filepath.Join(r.Dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	r.Git("add", "-A")
	r.Git("commit", "--quiet", "--allow-empty", "-m", "change")
	return r.Git("rev-parse", "HEAD")
}

// Clone clones the repository into a new temporary directory (another
// account's fork).
func (r *Repo) Clone(t testing.TB) *Repo {
	t.Helper()
	c := &Repo{t: t, Dir: t.TempDir()}
	if out, err := exec.Command("git", "clone", "--quiet", r.Dir, c.Dir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	return c
}
