package mirror

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"knotless.dev/run/internal/rules/job"
)

// Identity, SquashPull and Squashed are the merge queue's values of a
// squash: job's, which the parts name (job.Repo's Squash).
type (
	Identity   = job.Identity
	SquashPull = job.SquashPull
	Squashed   = job.Squashed
)

// Squash stacks pulls onto base in order without a work tree: each
// pull's head is merged onto the current tip (git merge-tree) and the
// resulting tree committed with the tip as its only parent. A pull that
// conflicts is left out and the next goes onto the same tip. The commits
// are made with who as author and committer at time at, so squashing the
// same pulls onto the same base again gives the same commits. It returns
// the last tip (base when nothing merged).
func (r *Repo) Squash(ctx context.Context, base string, pulls []SquashPull, who Identity, at time.Time) (string, []Squashed, error) {
	if !ValidCommit(base) {
		return "", nil, fmt.Errorf("%w: squash onto %q: not an object id", ErrRefused, base)
	}
	for _, p := range pulls {
		if !ValidCommit(p.Head) {
			return "", nil, fmt.Errorf("%w: squash %q: not an object id", ErrRefused, p.Head)
		}
	}
	if who.Name == "" || who.Email == "" || strings.ContainsAny(who.Name+who.Email, "<>\n") {
		return "", nil, fmt.Errorf("squash: identity %q <%s> is not usable", who.Name, who.Email)
	}
	date := fmt.Sprintf("@%d +0000", at.Unix())
	env := []string{
		"GIT_AUTHOR_NAME=" + who.Name, "GIT_AUTHOR_EMAIL=" + who.Email, "GIT_AUTHOR_DATE=" + date,
		"GIT_COMMITTER_NAME=" + who.Name, "GIT_COMMITTER_EMAIL=" + who.Email, "GIT_COMMITTER_DATE=" + date,
	}
	tip := base
	out := make([]Squashed, 0, len(pulls))
	for _, p := range pulls {
		s := Squashed{Head: p.Head}
		tree, paths, err := r.mergeTree(ctx, tip, p.Head)
		if err != nil {
			return "", nil, err
		}
		if tree == "" {
			s.Conflicts = paths
			s.ConflictsWithBase = true
			if tip != base {
				t, _, err := r.mergeTree(ctx, base, p.Head)
				if err != nil {
					return "", nil, err
				}
				s.ConflictsWithBase = t == ""
			}
			out = append(out, s)
			continue
		}
		msg := strings.TrimSpace(p.Message)
		if msg == "" {
			msg = "squash " + p.Head
		}
		c, err := r.m.gitIn(ctx, env, strings.NewReader(msg+"\n"), "--git-dir", r.Dir, "commit-tree", tree, "-p", tip)
		if err != nil {
			return "", nil, fmt.Errorf("squash %s: %w", p.Head, err)
		}
		s.Commit = strings.TrimSpace(c)
		names, err := r.git(ctx, "diff-tree", "-r", "-z", "--name-only", "--no-commit-id", tip, s.Commit)
		if err != nil {
			return "", nil, fmt.Errorf("squash %s: %w", p.Head, err)
		}
		for _, n := range strings.Split(names, "\x00") {
			if n != "" {
				s.Changed = append(s.Changed, n)
			}
		}
		tip = s.Commit
		out = append(out, s)
	}
	return tip, out, nil
}

// mergeTree merges head onto onto and returns the tree, or "" and the
// conflicting paths.
func (r *Repo) mergeTree(ctx context.Context, onto, head string) (string, []string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mergeTreeLocked(ctx, onto, head)
}

// mergeTreeLocked is git merge-tree -z: the tree, or "" and the
// conflicting paths as they are (not C-quoted: the same names as
// diff-tree -z gives, so that a conflict is matched to the pull that
// changed the path, whatever its characters).
func (r *Repo) mergeTreeLocked(ctx context.Context, onto, head string) (string, []string, error) {
	out, err := r.git(ctx, "merge-tree", "-z", "--write-tree", "--name-only", "--no-messages", onto, head)
	fields := strings.Split(strings.TrimSuffix(out, "\x00"), "\x00")
	var ee *exec.ExitError
	switch {
	case err == nil:
		return strings.TrimSpace(fields[0]), nil, nil
	case errors.As(err, &ee) && ee.ExitCode() == 1:
		var paths []string
		for _, p := range fields[1:] {
			if p != "" {
				paths = append(paths, p)
			}
		}
		return "", paths, nil
	default:
		return "", nil, fmt.Errorf("merge %s onto %s: %w", head, onto, err)
	}
}

// ErrBaseMoved is returned by Push when the branch no longer points at
// the commit the batch was built on: the batch must be rebuilt.
var ErrBaseMoved = errors.New("the base branch moved")

// Push moves branch of source from old to new, a descendant of old,
// and never anything else: no force; when the branch is no longer at old
// (checked before, and leased during, the push) it returns ErrBaseMoved.
// It authenticates with the one of creds bound to source
// (PushCredentials.For); with creds but none bound to source it pushes
// nothing and returns an error wrapping ErrNoCredential.
func (r *Repo) Push(ctx context.Context, source, branch, old, new string, creds PushCredentials) error {
	if !ValidCommit(old) || !ValidCommit(new) {
		return fmt.Errorf("%w: push %q over %q: not object ids", ErrRefused, new, old)
	}
	ref := "refs/heads/" + branch
	if err := CheckRef(ref, "refs/heads/"); err != nil {
		return fmt.Errorf("push: %w", err)
	}
	src, err := r.m.CheckSource(source, Owner)
	if err != nil {
		return err
	}
	if _, err := r.git(ctx, "merge-base", "--is-ancestor", old, new); err != nil {
		return fmt.Errorf("push %s to %s: %s is not a descendant of %s: refused (no force push)", branch, source, new, old)
	}
	cred, err := creds.For(src)
	if err != nil {
		return fmt.Errorf("push %s to %s: %w", branch, source, err)
	}
	var env []string
	var cfg [][2]string
	if cred != nil {
		t, _, err := target(src)
		if err != nil {
			return fmt.Errorf("push %s to %s: %w", branch, source, err)
		}
		if env, cfg, err = cred.gitAuth(t); err != nil {
			return fmt.Errorf("push %s to %s: %w", branch, source, err)
		}
	}
	env = append(env, "GIT_ALLOW_PROTOCOL="+src.Protocol)
	args := []string{"--git-dir", r.Dir}
	r.mu.Lock()
	defer r.mu.Unlock()
	lsArgs := append(append([]string{}, args...), "ls-remote", "--", src.URL, ref)
	out, err := r.m.gitCfg(ctx, env, cfg, nil, lsArgs...)
	if err != nil {
		return fmt.Errorf("push %s to %s: read the branch: %w", branch, source, err)
	}
	if cur, _, _ := strings.Cut(strings.TrimSpace(out), "\t"); cur != old {
		return fmt.Errorf("push %s to %s: it is at %q, not %s: %w", branch, source, cur, old, ErrBaseMoved)
	}
	pushArgs := append(append([]string{}, args...), "push", "--porcelain", "--no-verify",
		"--force-with-lease="+ref+":"+old, "--", src.URL, new+":"+ref)
	out, err = r.m.gitCfg(ctx, env, cfg, nil, pushArgs...)
	if err != nil {
		if strings.Contains(out, "stale info") || strings.Contains(out, "fetch first") || strings.Contains(out, "non-fast-forward") ||
			strings.Contains(err.Error(), "stale info") {
			return fmt.Errorf("push %s to %s: %w", branch, source, ErrBaseMoved)
		}
		return fmt.Errorf("push %s to %s: %w", branch, source, err)
	}
	return nil
}

// Has reports whether commit is in the mirror.
func (r *Repo) Has(ctx context.Context, commit string) bool {
	return ValidCommit(commit) && r.has(ctx, commit)
}

// MaxChanged bounds the paths Changed lists: a change that touches more
// is too large to say which files it touched (ErrTooManyChanged).
const MaxChanged = 20000

// ErrTooManyChanged is a change of more than MaxChanged paths.
var ErrTooManyChanged = errors.New("the change touches more paths than the runner lists")

// Changed lists the paths that differ between the commits from and to
// of the mirror (git diff-tree -r, renames as a deletion and an
// addition), as git names them (-z: not C-quoted). With mergeBase, from
// is first taken to its merge base with to: what a pull changed since
// it left its base branch. Both are object ids the mirror holds; the
// names are the source's, as a stranger wrote them, and only matched.
func (r *Repo) Changed(ctx context.Context, from, to string, mergeBase bool) ([]string, error) {
	if !ValidCommit(from) || !ValidCommit(to) {
		return nil, fmt.Errorf("%w: changes from %q to %q: not object ids", ErrRefused, from, to)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if mergeBase {
		out, err := r.git(ctx, "merge-base", from, to)
		if err != nil {
			return nil, fmt.Errorf("merge base of %s and %s: %w", from, to, err)
		}
		if from = strings.TrimSpace(out); !ValidCommit(from) {
			return nil, fmt.Errorf("merge base of %s and %s: %q", from, to, out)
		}
	}
	out, err := r.git(ctx, "diff-tree", "-r", "-z", "--name-only", "--no-renames", "--no-commit-id", from, to)
	if err != nil {
		return nil, fmt.Errorf("changes from %s to %s: %w", from, to, err)
	}
	var names []string
	for _, n := range strings.Split(out, "\x00") {
		if n == "" {
			continue
		}
		if len(names) == MaxChanged {
			return nil, fmt.Errorf("changes from %s to %s: %w (%d)", from, to, ErrTooManyChanged, MaxChanged)
		}
		names = append(names, n)
	}
	return names, nil
}
