// Package mirror keeps bare git mirrors of the repositories a runner
// serves: it fetches the commits runs need, merges a pull's head onto its
// base without a work tree, reads workflow files at a commit and exports
// a tree as a plain directory for a run.
//
// Every source is checked against a Policy before git sees it, every ref
// and object id is validated before it reaches git's argv, every git
// command runs with a clean environment and a deadline, and what is read
// or exported is bounded.
package mirror

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"knotless.dev/run/internal/rules/workflow"
)

// Options configure the mirrors. Zero fields take the defaults.
type Options struct {
	Policy
	// Timeout bounds every git command (--git-timeout; default 5 m).
	Timeout time.Duration
	// MaxWorkflowBytes caps one workflow file (default 256 KiB),
	// MaxWorkflows the number of workflow files (default 100), and
	// MaxCheckoutBytes the sum of a tree's file sizes an export writes
	// (default 2 GiB).
	MaxWorkflowBytes int64
	MaxWorkflows     int
	MaxCheckoutBytes int64
}

// The defaults of Options.
const (
	DefaultTimeout          = 5 * time.Minute
	DefaultMaxWorkflowBytes = 256 << 10
	DefaultMaxWorkflows     = 100
	DefaultMaxCheckoutBytes = 2 << 30
)

// errGitTimeout is the cause of a git command's context ending at
// Options.Timeout.
var errGitTimeout = errors.New("git timeout")

// maxOutput caps what one git command may print (listings included).
const maxOutput = 32 << 20

// Mirrors holds one bare repository per key under Dir.
type Mirrors struct {
	dir  string
	home string // an empty, read-only HOME for git
	// global is git's only config file beyond the repository's own:
	// /dev/null, or with local sources allowed one trusting their owners.
	global string
	path   string // PATH for git (its transports' ssh)
	opts   Options
	mu     sync.Mutex
	locks  map[string]*sync.Mutex
	// fetches counts the fetches into each mirror (by directory) in
	// this process (maintainNow).
	fetches    map[string]int
	gitVersion string
}

// New returns mirrors kept under dir (created when missing). A local
// source under dir is always refused, as are those under opts.Forbidden.
func New(dir string, opts Options) (*Mirrors, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("mirrors: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("mirrors: %w", err)
	}
	home := filepath.Join(abs, ".home")
	if err := os.MkdirAll(home, 0o500); err != nil {
		return nil, fmt.Errorf("mirrors: %w", err)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxWorkflowBytes <= 0 {
		opts.MaxWorkflowBytes = DefaultMaxWorkflowBytes
	}
	if opts.MaxWorkflows <= 0 {
		opts.MaxWorkflows = DefaultMaxWorkflows
	}
	if opts.MaxCheckoutBytes <= 0 {
		opts.MaxCheckoutBytes = DefaultMaxCheckoutBytes
	}
	opts.Forbidden = append([]string{abs}, opts.Forbidden...)
	global := os.DevNull
	if opts.AllowLocal {
		// git refuses a local repository another user owns unless
		// safe.directory (from protected config only) allows it; the
		// operator who allows local sources trusts their owners.
		global = filepath.Join(abs, ".gitconfig")
		if err := os.WriteFile(global, []byte("[safe]\n\tdirectory = *\n"), 0o640); err != nil {
			return nil, fmt.Errorf("mirrors: %w", err)
		}
	}
	// PATH is the one variable of the daemon's environment git gets: its
	// ssh transport runs "ssh" from it.
	p := os.Getenv("PATH")
	if p == "" {
		p = "/usr/local/bin:/usr/bin:/bin"
	}
	m := &Mirrors{dir: abs, home: home, global: global, path: p, opts: opts, locks: map[string]*sync.Mutex{}, fetches: map[string]int{}}
	if m.gitVersion, err = m.checkGit(); err != nil {
		return nil, err
	}
	return m, nil
}

// minGitVersion is the oldest git the mirrors work with: merge-tree
// --write-tree (a pull merged onto its base) came in 2.38, cat-file
// --batch-command (a commit's workflows read) in 2.36.
var minGitVersion = [2]int{2, 38}

// checkGit runs `git version` and refuses a git older than
// minGitVersion, naming it; its answer is GitVersion.
func (m *Mirrors) checkGit() (string, error) {
	where, err := exec.LookPath("git")
	if err != nil {
		return "", fmt.Errorf("mirrors: no git in PATH: %w", err)
	}
	out, err := m.git(context.Background(), nil, "version")
	if err != nil {
		return "", fmt.Errorf("mirrors: %s: %w", where, err)
	}
	version := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out), "git version "))
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return "", fmt.Errorf("mirrors: %s says %q: not a git version", where, strings.TrimSpace(out))
	}
	if major < minGitVersion[0] || major == minGitVersion[0] && minor < minGitVersion[1] {
		return "", fmt.Errorf("mirrors: %s is git %s; knotless-run needs git %d.%d or later (merge-tree --write-tree, cat-file --batch-command)",
			where, version, minGitVersion[0], minGitVersion[1])
	}
	return version, nil
}

// GitVersion is the version of the git the mirrors run.
func (m *Mirrors) GitVersion() string { return m.gitVersion }

// Repo is one bare mirror.
type Repo struct {
	Dir string
	m   *Mirrors
	mu  *sync.Mutex
}

// Open returns the mirror for key, creating it. Keys are the daemon's
// choice: one mirror per repository for its pushes, one per pull, so
// that nothing a pull fetched is in another's mirror.
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
	r := &Repo{Dir: filepath.Join(m.dir, name), m: m, mu: l}
	if _, err := os.Stat(filepath.Join(r.Dir, "HEAD")); err == nil {
		return r, nil
	}
	l.Lock()
	defer l.Unlock()
	if _, err := m.git(ctx, nil, "init", "--quiet", "--bare", r.Dir); err != nil {
		return nil, fmt.Errorf("create mirror: %w", err)
	}
	return r, nil
}

// CheckSource applies the mirrors' policy to source, also refusing a
// local source whose real path (symbolic links followed) is in a
// forbidden directory.
func (m *Mirrors) CheckSource(source string, origin Origin) (Source, error) {
	src, err := CheckSource(source, origin, m.opts.Policy)
	if err != nil || src.Local == "" {
		return src, err
	}
	real, err := filepath.EvalSymlinks(src.Local)
	if err != nil {
		return src, nil // git will not find it either
	}
	for _, dir := range m.opts.Forbidden {
		if d, err := filepath.EvalSymlinks(dir); err == nil && within(real, d) {
			return Source{}, fmt.Errorf("%w: %s %q: inside the runner's own directory %s (its mirrors and state belong to other repositories)", ErrRefused, origin, source, dir)
		}
	}
	return src, nil
}

// refPrefixes are what a ref named by origin may start with.
func refPrefixes(origin Origin) []string {
	if origin == Pull {
		return []string{"refs/heads/"}
	}
	return []string{"refs/heads/", "refs/tags/"}
}

// Fetch makes sure commit is in the mirror, fetching it from source: by
// its id, else through ref (a server may refuse wants that are not ref
// tips). The source, the ref and the commit are checked first; a refusal
// wraps ErrRefused.
func (r *Repo) Fetch(ctx context.Context, origin Origin, source, ref, commit string) error {
	if !ValidCommit(commit) {
		return fmt.Errorf("%w: fetch: %q is not a full commit id", ErrRefused, commit)
	}
	src, err := r.m.CheckSource(source, origin)
	if err != nil {
		return err
	}
	if ref != "" {
		if err := CheckRef(ref, refPrefixes(origin)...); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.has(ctx, commit) {
		return nil
	}
	errByID := r.fetch(ctx, src, origin, commit)
	if r.has(ctx, commit) {
		r.maintainNow(ctx)
		return nil
	}
	if ref != "" {
		if err := r.fetch(ctx, src, origin, ref); err != nil {
			return fmt.Errorf("fetch %s from %s: %w", ref, source, err)
		}
		if r.has(ctx, commit) {
			r.maintainNow(ctx)
			return nil
		}
	}
	if errByID != nil {
		return fmt.Errorf("fetch %s from %s: %w", commit, source, errByID)
	}
	return fmt.Errorf("fetch %s from %s: commit not found", commit, source)
}

// fetch runs git fetch of one refspec from a checked source, allowing
// that source's transport only. A pull's fetch follows no redirect. It
// runs no maintenance (maintainNow does).
func (r *Repo) fetch(ctx context.Context, src Source, origin Origin, refspec string) error {
	redirects := "initial"
	if origin == Pull {
		redirects = "false"
	}
	_, err := r.m.git(ctx, []string{"GIT_ALLOW_PROTOCOL=" + src.Protocol},
		"-c", "http.followRedirects="+redirects, "-c", "maintenance.auto=false", "--git-dir", r.Dir,
		"fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules", "--", src.URL, refspec)
	return err
}

// maintainEvery is how many fetches into one mirror go between two of
// its maintenance runs.
const maintainEvery = 16

// maintainNow runs git's automatic maintenance (gc --auto: packing loose
// objects once there are many) after the first fetch into the mirror in
// this process and after every maintainEvery-th one, instead of after
// every fetch as git fetch would: a process the fetch of a push waits
// for, and that finds nothing to do on almost every run. r.mu is held.
// A failure leaves the mirror as it was and is not the fetch's.
func (r *Repo) maintainNow(ctx context.Context) {
	r.m.mu.Lock()
	n := r.m.fetches[r.Dir]
	r.m.fetches[r.Dir] = n + 1
	r.m.mu.Unlock()
	if n%maintainEvery == 0 {
		_, _ = r.git(ctx, "maintenance", "run", "--auto", "--quiet")
	}
}

// Branch fetches branch from source (a repository's own) and returns the
// commit it points at; a branch the source does not have is an error
// wrapping ErrNoBranch.
func (r *Repo) Branch(ctx context.Context, source, branch string) (string, error) {
	src, err := r.m.CheckSource(source, Owner)
	if err != nil {
		return "", err
	}
	ref := "refs/heads/" + branch
	if err := CheckRef(ref, "refs/heads/"); err != nil {
		return "", fmt.Errorf("base branch: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	local := "refs/knotless/base/" + branch
	if err := r.fetch(ctx, src, Owner, "+"+ref+":"+local); err != nil {
		// git's words (LC_ALL=C) for a ref the source does not have.
		if strings.Contains(err.Error(), "couldn't find remote ref "+ref) {
			return "", fmt.Errorf("%w %s at %s", ErrNoBranch, branch, source)
		}
		return "", fmt.Errorf("fetch branch %s from %s: %w", branch, source, err)
	}
	r.maintainNow(ctx)
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
	if !ValidCommit(base) || !ValidCommit(head) {
		return "", fmt.Errorf("%w: merge %q onto %q: not object ids", ErrRefused, head, base)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	tree, paths, err := r.mergeTreeLocked(ctx, base, head)
	switch {
	case err != nil:
		return "", err
	case tree == "":
		return "", &ConflictError{Base: base, Head: head, Detail: "conflicting paths: " + strings.Join(paths, ", ")}
	}
	return tree, nil
}

// entry is one line of git ls-tree -l.
type entry struct {
	mode, typ, id string
	size          int64 // -1 for a submodule's commit
	name          string
}

// lsTree lists treeish (with -r, recursively) with sizes.
func (r *Repo) lsTree(ctx context.Context, recursive bool, treeish string) ([]entry, error) {
	args := []string{"ls-tree", "-z", "-l"}
	if recursive {
		args = append(args, "-r")
	}
	out, err := r.git(ctx, append(args, "--", treeish)...)
	if err != nil {
		return nil, err
	}
	var entries []entry
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, maxOutput)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, 0); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	for sc.Scan() {
		meta, name, ok := strings.Cut(sc.Text(), "\t")
		f := strings.Fields(meta)
		if !ok || len(f) != 4 {
			return nil, fmt.Errorf("ls-tree %s: unexpected line %q", treeish, sc.Text())
		}
		size := int64(-1)
		if f[3] != "-" {
			if size, err = strconv.ParseInt(f[3], 10, 64); err != nil {
				return nil, fmt.Errorf("ls-tree %s: size %q", treeish, f[3])
			}
		}
		entries = append(entries, entry{mode: f[0], typ: f[1], id: f[2], size: size, name: name})
	}
	return entries, sc.Err()
}

// Workflows reads .knotless/workflows/*.yaml at treeish (an object id).
// Files that do not parse, or whose needs are wrong
// (workflow.CheckNeeds), are returned as errors beside the ones that
// do. More files than MaxWorkflows, or one larger than MaxWorkflowBytes,
// is an error wrapping ErrRefused, found from the listing and the
// files' sizes before any file is read. One git process reads it all
// (cat-file --batch-command), not one for the listing and one a file.
func (r *Repo) Workflows(ctx context.Context, treeish string) ([]*workflow.Workflow, []error, error) {
	if !ValidCommit(treeish) {
		return nil, nil, fmt.Errorf("%w: workflows at %q: not an object id", ErrRefused, treeish)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := r.batch(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list workflows: %w", err)
	}
	defer b.close()
	files, err := workflowFiles(b, treeish)
	if err != nil {
		return nil, nil, fmt.Errorf("list workflows: %w", err)
	}
	lim := r.m.opts
	if len(files) > lim.MaxWorkflows {
		return nil, nil, fmt.Errorf("%w: %d workflow files in %s, more than the limit of %d (--max-workflows)", ErrRefused, len(files), workflow.Dir, lim.MaxWorkflows)
	}
	for _, e := range files {
		_, _, size, err := b.info(e.id)
		if err != nil {
			return nil, nil, fmt.Errorf("list workflows: %w", err)
		}
		if size > lim.MaxWorkflowBytes {
			return nil, nil, fmt.Errorf("%w: workflow file %s is %d bytes, more than the limit of %d (--max-workflow-bytes)",
				ErrRefused, path.Join(workflow.Dir, e.name), size, lim.MaxWorkflowBytes)
		}
	}
	var wfs []*workflow.Workflow
	var bad []error
	for _, e := range files {
		file := path.Join(workflow.Dir, e.name)
		_, _, data, err := b.contents(e.id, lim.MaxWorkflowBytes)
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", file, err)
		}
		wf, err := workflow.Parse(file, data)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		wfs = append(wfs, wf)
	}
	// A workflow whose needs are wrong (a name that is no workflow, a
	// cycle) is a file with errors too: it gets an error check.
	var invalid []string
	for _, e := range bad {
		invalid = append(invalid, workflow.FileName(e))
	}
	if needErrs := workflow.CheckNeeds(wfs, invalid...); len(needErrs) > 0 {
		good := wfs[:0]
		for _, wf := range wfs {
			if errs := needErrs[wf.Name]; len(errs) > 0 {
				bad = append(bad, errs)
				continue
			}
			good = append(good, wf)
		}
		wfs = good
	}
	return wfs, bad, nil
}

// workflowFiles lists the workflow files (*.yaml, *.yml) of treeish's
// workflow directory: none when it has no such directory; an error when
// treeish is no tree or commit of the mirror, or the directory is a file.
func workflowFiles(b *batch, treeish string) ([]treeEntry, error) {
	if _, _, _, err := b.info(treeish + "^{tree}"); err != nil {
		return nil, err
	}
	id, typ, data, err := b.contents(treeish+":"+workflow.Dir, maxOutput)
	if errors.Is(err, errObjectMissing) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if typ != "tree" {
		return nil, fmt.Errorf("%s at %s is a %s, not a directory", workflow.Dir, treeish, typ)
	}
	entries, err := parseTree(data, len(id)/2)
	if err != nil {
		return nil, fmt.Errorf("%s at %s: %w", workflow.Dir, treeish, err)
	}
	var files []treeEntry
	for _, e := range entries {
		if e.blob() && (strings.HasSuffix(e.name, ".yaml") || strings.HasSuffix(e.name, ".yml")) {
			files = append(files, e)
		}
	}
	return files, nil
}

// Export writes the tree at treeish (an object id) into dir (which must
// not exist) as plain files, through a temporary index: the mirror is
// never checked out and no hook runs. A tree whose files add up to more
// than MaxCheckoutBytes is refused before anything is written.
func (r *Repo) Export(ctx context.Context, treeish, dir string) error {
	if !ValidCommit(treeish) {
		return fmt.Errorf("%w: export %q: not an object id", ErrRefused, treeish)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	entries, err := r.lsTree(ctx, true, treeish)
	if err != nil {
		return fmt.Errorf("export %s: %w", treeish, err)
	}
	var total int64
	for _, e := range entries {
		if e.size > 0 {
			total += e.size
		}
	}
	if total > r.m.opts.MaxCheckoutBytes {
		return fmt.Errorf("%w: export %s: its files are %d bytes, more than the limit of %d (--max-checkout)", ErrRefused, treeish, total, r.m.opts.MaxCheckoutBytes)
	}
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
	env := []string{"GIT_INDEX_FILE=" + idx.Name()}
	if _, err := r.m.git(ctx, env, "--git-dir", r.Dir, "read-tree", treeish); err != nil {
		return fmt.Errorf("export %s: %w", treeish, err)
	}
	if _, err := r.m.git(ctx, env, "--git-dir", r.Dir, "--work-tree", filepath.Clean(dir), "checkout-index", "--all", "--force"); err != nil {
		return fmt.Errorf("export %s: %w", treeish, err)
	}
	return nil
}

func (r *Repo) has(ctx context.Context, commit string) bool {
	_, err := r.git(ctx, "cat-file", "-e", commit+"^{commit}")
	return err == nil
}

func (r *Repo) git(ctx context.Context, args ...string) (string, error) {
	return r.m.git(ctx, nil, append([]string{"--git-dir", r.Dir}, args...)...)
}

// git runs one git command with the clean environment plus extra, under
// the timeout, and returns its output (also on failure). On cancel or
// timeout its whole process group is killed and it returns even if a
// transport child still holds its pipes.
func (m *Mirrors) git(ctx context.Context, extra []string, args ...string) (string, error) {
	return m.gitIn(ctx, extra, nil, args...)
}

// gitIn is git with stdin (nil: none) and, beyond the clean
// environment's, the configuration cfg.
func (m *Mirrors) gitIn(ctx context.Context, extra []string, stdin io.Reader, args ...string) (string, error) {
	return m.gitCfg(ctx, extra, nil, stdin, args...)
}

func (m *Mirrors) gitCfg(ctx context.Context, extra []string, cfg [][2]string, stdin io.Reader, args ...string) (string, error) {
	cmd, ctx, cancel := m.command(ctx, extra, cfg, args...)
	defer cancel()
	cmd.Stdin = stdin
	stdout := &capped{max: maxOutput}
	stderr := &capped{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	what := "git " + gitVerb(args)
	switch {
	case err == nil && stdout.over:
		return "", fmt.Errorf("%s: output over %d bytes", what, maxOutput)
	case err == nil:
		return stdout.String(), nil
	}
	if err := m.stopped(ctx, what); err != nil {
		return stdout.String(), err
	}
	msg := strings.TrimSpace(stderr.String())
	if len(msg) > 2000 {
		msg = msg[:2000] + "…"
	}
	return stdout.String(), fmt.Errorf("%s: %w: %s", what, err, msg)
}

// command is git with args as every git command of the mirrors runs:
// the clean environment plus cfg and extra, in its own process group
// (killed whole on cancel or timeout, and waited for no longer than 2 s
// after, even if a transport child still holds its pipes), under the
// git timeout. The context returned is the command's; cancel releases
// it.
func (m *Mirrors) command(ctx context.Context, extra []string, cfg [][2]string, args ...string) (*exec.Cmd, context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeoutCause(ctx, m.opts.Timeout, errGitTimeout)
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(m.env(cfg...), extra...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	return cmd, ctx, cancel
}

// stopped says why the git command what, of the context ctx that
// command returned, was stopped: the git timeout or the caller's
// context; nil when it was not.
func (m *Mirrors) stopped(ctx context.Context, what string) error {
	switch {
	case context.Cause(ctx) == errGitTimeout:
		return fmt.Errorf("%s: no end within %s (--git-timeout)", what, m.opts.Timeout)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	return nil
}

// gitVerb names a git command by its subcommand, skipping global options.
func gitVerb(args []string) string {
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-c" || a == "--git-dir" || a == "--work-tree":
			i++
		case !strings.HasPrefix(a, "-"):
			return a
		}
	}
	return strings.Join(args, " ")
}

// env is every git command's environment: nothing of the daemon's but
// PATH; an empty HOME; no system config and no global config of the
// daemon user's (only m.global), so no credential
// helper, url rewrite or proxy; no prompt, no ssh agent; hooks off and
// every transport refused unless a fetch allows its one
// (GIT_ALLOW_PROTOCOL).
func (m *Mirrors) env(extra ...[2]string) []string {
	cfg := append([][2]string{
		{"protocol.allow", "never"},
		{"core.hooksPath", "/dev/null"},
		{"credential.helper", ""},
		{"core.askPass", ""},
	}, extra...)
	env := []string{
		"PATH=" + m.path,
		"HOME=" + m.home,
		"XDG_CONFIG_HOME=" + m.home,
		"LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=" + m.global,
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=/bin/false",
		"SSH_ASKPASS=/bin/false",
		"GIT_SSH_COMMAND=ssh -o BatchMode=yes -o IdentityAgent=none",
		"GIT_CONFIG_COUNT=" + strconv.Itoa(len(cfg)),
	}
	for i, kv := range cfg {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, kv[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, kv[1]))
	}
	return env
}

// capped is a buffer that keeps at most max bytes and notes the excess.
type capped struct {
	bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); len(p) > room {
		c.over = true
		if room > 0 {
			c.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return c.Buffer.Write(p)
}
