// Package mirror keeps bare git mirrors of the repositories a runner
// serves: it fetches the commits runs need, merges a pull's head onto its
// base without a work tree, reads workflow files at a commit and exports
// a tree as a plain directory for a run.
package mirror

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"knotless.dev/run/internal/workflow"
)

// Mirrors holds one bare repository per key under Dir.
type Mirrors struct {
	dir   string
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// New returns mirrors kept under dir (created when missing).
func New(dir string) (*Mirrors, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("mirrors: %w", err)
	}
	return &Mirrors{dir: dir, locks: map[string]*sync.Mutex{}}, nil
}

// Repo is one bare mirror.
type Repo struct {
	Dir string
	mu  *sync.Mutex
}

// Open returns the mirror for key (a repository's AT-URI), creating it.
func (m *Mirrors) Open(ctx context.Context, key string) (*Repo, error) {
	h := sha256.Sum256([]byte(key))
	name := hex.EncodeToString(h[:12]) + ".git"
	m.mu.Lock()
	l, ok := m.locks[name]
	if !ok {
		l = &sync.Mutex{}
		m.locks[name] = l
	}
	m.mu.Unlock()
	r := &Repo{Dir: filepath.Join(m.dir, name), mu: l}
	if _, err := os.Stat(filepath.Join(r.Dir, "HEAD")); err == nil {
		return r, nil
	}
	l.Lock()
	defer l.Unlock()
	if _, err := git(ctx, "", "init", "--quiet", "--bare", r.Dir); err != nil {
		return nil, fmt.Errorf("create mirror: %w", err)
	}
	return r, nil
}

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// ValidCommit reports whether s is a full commit id.
func ValidCommit(s string) bool { return commitRE.MatchString(s) }

// Fetch makes sure commit is in the mirror, fetching it from source: by
// its id, else through ref (a server may refuse wants that are not ref
// tips).
func (r *Repo) Fetch(ctx context.Context, source, ref, commit string) error {
	if !ValidCommit(commit) {
		return fmt.Errorf("fetch: %q is not a full commit id", commit)
	}
	if err := checkSource(source); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.has(ctx, commit) {
		return nil
	}
	_, errByID := r.git(ctx, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", source, commit)
	if r.has(ctx, commit) {
		return nil
	}
	if ref != "" && !strings.HasPrefix(ref, "-") {
		if _, err := r.git(ctx, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", source, ref); err != nil {
			return fmt.Errorf("fetch %s from %s: %w", ref, source, err)
		}
		if r.has(ctx, commit) {
			return nil
		}
	}
	if errByID != nil {
		return fmt.Errorf("fetch %s from %s: %w", commit, source, errByID)
	}
	return fmt.Errorf("fetch %s from %s: commit not found", commit, source)
}

// Branch fetches branch from source and returns the commit it points at.
func (r *Repo) Branch(ctx context.Context, source, branch string) (string, error) {
	if err := checkSource(source); err != nil {
		return "", err
	}
	if branch == "" || strings.HasPrefix(branch, "-") || strings.ContainsAny(branch, " :~^?*[\\") {
		return "", fmt.Errorf("fetch branch %q: not a branch name", branch)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	local := "refs/knotless/base/" + branch
	if _, err := r.git(ctx, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", source, "+refs/heads/"+branch+":"+local); err != nil {
		return "", fmt.Errorf("fetch branch %s from %s: %w", branch, source, err)
	}
	out, err := r.git(ctx, "rev-parse", "--verify", local+"^{commit}")
	if err != nil {
		return "", fmt.Errorf("fetch branch %s: %w", branch, err)
	}
	return strings.TrimSpace(out), nil
}

// ConflictError is a pull whose head does not merge onto its base.
type ConflictError struct {
	Base, Head string
	Detail     string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("merge conflict: head %s does not merge onto base %s:\n%s", e.Head, e.Base, e.Detail)
}

// Merge merges head onto base without a work tree and returns the
// resulting tree's id; a conflict is a *ConflictError naming the paths.
func (r *Repo) Merge(ctx context.Context, base, head string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmd := exec.CommandContext(ctx, "git", "--git-dir", r.Dir, "merge-tree", "--write-tree", "--name-only", "--no-messages", base, head)
	cmd.Env = gitEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var ee *exec.ExitError
	switch {
	case err == nil:
		return strings.TrimSpace(lines[0]), nil
	case errors.As(err, &ee) && ee.ExitCode() == 1:
		return "", &ConflictError{Base: base, Head: head, Detail: "conflicting paths: " + strings.Join(lines[1:], ", ")}
	default:
		return "", fmt.Errorf("merge %s onto %s: %w: %s", head, base, err, strings.TrimSpace(stderr.String()))
	}
}

// Workflows reads .knotless/workflows/*.yaml at treeish. Files that do
// not parse are returned as errors beside the ones that do.
func (r *Repo) Workflows(ctx context.Context, treeish string) ([]*workflow.Workflow, []error, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, err := r.git(ctx, "ls-tree", "-z", "--name-only", treeish+":"+workflow.Dir)
	if err != nil {
		if r.missingPath(ctx, treeish, workflow.Dir) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("list workflows: %w", err)
	}
	var wfs []*workflow.Workflow
	var bad []error
	for _, name := range strings.Split(out, "\x00") {
		if !strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml") {
			continue
		}
		file := path.Join(workflow.Dir, name)
		data, err := r.git(ctx, "cat-file", "blob", treeish+":"+file)
		if err != nil {
			bad = append(bad, fmt.Errorf("read %s: %w", file, err))
			continue
		}
		wf, err := workflow.Parse(file, []byte(data))
		if err != nil {
			bad = append(bad, err)
			continue
		}
		wfs = append(wfs, wf)
	}
	return wfs, bad, nil
}

func (r *Repo) missingPath(ctx context.Context, treeish, p string) bool {
	if _, err := r.git(ctx, "rev-parse", "--verify", "--quiet", treeish+"^{tree}"); err != nil {
		return false
	}
	_, err := r.git(ctx, "cat-file", "-e", treeish+":"+p)
	return err != nil
}

// Export writes the tree at treeish into dir (which must not exist) as
// plain files, through a temporary index: the mirror is never checked
// out and no hook runs.
func (r *Repo) Export(ctx context.Context, treeish, dir string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	idx, err := os.CreateTemp(filepath.Dir(filepath.Clean(dir)), ".index-")
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	idx.Close()
	os.Remove(idx.Name())
	defer os.Remove(idx.Name())
	env := append(gitEnv(), "GIT_INDEX_FILE="+idx.Name())
	if _, err := runGit(ctx, env, "--git-dir", r.Dir, "read-tree", treeish); err != nil {
		return fmt.Errorf("export %s: %w", treeish, err)
	}
	if _, err := runGit(ctx, env, "--git-dir", r.Dir, "--work-tree", filepath.Clean(dir), "checkout-index", "--all", "--force"); err != nil {
		return fmt.Errorf("export %s: %w", treeish, err)
	}
	return nil
}

func (r *Repo) has(ctx context.Context, commit string) bool {
	_, err := r.git(ctx, "cat-file", "-e", commit+"^{commit}")
	return err == nil
}

func (r *Repo) git(ctx context.Context, args ...string) (string, error) {
	return git(ctx, r.Dir, args...)
}

func git(ctx context.Context, gitDir string, args ...string) (string, error) {
	if gitDir != "" {
		args = append([]string{"--git-dir", gitDir}, args...)
	}
	return runGit(ctx, gitEnv(), args...)
}

func runGit(ctx context.Context, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[:2000] + "…"
		}
		return "", fmt.Errorf("git %s: %w: %s", args[len(args)-1], err, msg)
	}
	return stdout.String(), nil
}

// gitEnv is the environment of every git command: the process's own
// (ssh agents, proxies, credential helpers live there), never prompting,
// and with the ext transport refused.
func gitEnv() []string {
	return append(os.Environ(),
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=/bin/false",
		"SSH_ASKPASS=/bin/false",
		"GIT_CONFIG_COUNT=2",
		"GIT_CONFIG_KEY_0=protocol.ext.allow",
		"GIT_CONFIG_VALUE_0=never",
		"GIT_CONFIG_KEY_1=core.hooksPath",
		"GIT_CONFIG_VALUE_1=/dev/null",
	)
}

// checkSource refuses a source that git would read as an option.
func checkSource(source string) error {
	if source == "" || strings.HasPrefix(source, "-") {
		return fmt.Errorf("git source %q: not a URL", source)
	}
	return nil
}
