package mirror

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// source makes a repository with one commit of files on main.
func source(t *testing.T, files map[string]string) (dir, commit string) {
	t.Helper()
	dir = t.TempDir()
	gitIn(t, dir, "init", "--quiet", "--initial-branch=main")
	return dir, commitFiles(t, dir, files)
}

func open(t *testing.T, opts Options, key string) *Repo {
	t.Helper()
	m, err := New(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Open(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// silentServer accepts connections and never answers.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return "http://" + ln.Addr().String() + "/r.git"
}

// TestFetchSilentServer: a server that accepts and never answers holds
// a fetch no longer than --git-timeout, and a cancelled fetch returns at
// once, although git's transport child still holds its pipes.
func TestFetchSilentServer(t *testing.T) {
	t.Parallel()
	url := silentServer(t)
	commit := strings.Repeat("a", 40)
	wait := func(t *testing.T, done <-chan error, within time.Duration) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(within):
			t.Fatalf("the fetch from a silent server did not return within %s", within)
			return nil
		}
	}
	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		r := open(t, Options{Policy: Policy{AllowHTTP: true}, Timeout: time.Second}, "k")
		done := make(chan error, 1)
		go func() { done <- r.Fetch(context.Background(), Owner, url, "refs/heads/main", commit) }()
		err := wait(t, done, 20*time.Second)
		if err == nil || !strings.Contains(err.Error(), "--git-timeout") {
			t.Errorf("got %v, want an error naming --git-timeout", err)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		r := open(t, Options{Policy: Policy{AllowHTTP: true}, Timeout: time.Hour}, "k")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Fetch(ctx, Owner, url, "refs/heads/main", commit) }()
		time.Sleep(time.Second)
		cancel()
		if err := wait(t, done, 10*time.Second); !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	})
}

// TestFetchRefusesLocalSources: a local source is refused by default,
// naming the flag; with the flag, another mirror of the runner (another
// tenant's objects) is still refused, as its path or through a link.
func TestFetchRefusesLocalSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, commit := source(t, map[string]string{"a.txt": "secret\n"})

	def := open(t, Options{}, "k")
	err := def.Fetch(ctx, Owner, "file://"+src, "refs/heads/main", commit)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "--allow-local-sources") {
		t.Errorf("default policy, file://: %v, want a refusal naming --allow-local-sources", err)
	}
	if err := def.Fetch(ctx, Pull, src, "refs/heads/main", commit); !errors.Is(err, ErrRefused) {
		t.Errorf("default policy, a path: %v, want refused", err)
	}

	m, err := New(t.TempDir(), Options{Policy: Policy{AllowLocal: true}})
	if err != nil {
		t.Fatal(err)
	}
	victim, _ := m.Open(ctx, "victim")
	if err := victim.Fetch(ctx, Owner, "file://"+src, "refs/heads/main", commit); err != nil {
		t.Fatal(err)
	}
	attacker, _ := m.Open(ctx, "attacker")
	link := filepath.Join(t.TempDir(), "link.git")
	if err := os.Symlink(victim.Dir, link); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{victim.Dir, "file://" + victim.Dir, link} {
		err := attacker.Fetch(ctx, Pull, s, "refs/heads/main", commit)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "runner's own directory") {
			t.Errorf("pull from another mirror %s: %v, want refused", s, err)
		}
	}
	if attacker.has(ctx, commit) {
		t.Error("the attacker's mirror has the victim's commit")
	}
}

// TestFetchRefIsNoRefspec: a record's ref that is a refspec is refused
// before git sees it; it writes no ref into the mirror.
func TestFetchRefIsNoRefspec(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, _ := source(t, map[string]string{"a.txt": "x\n"})
	r := open(t, Options{Policy: Policy{AllowLocal: true}}, "k")
	for _, ref := range []string{"refs/heads/main:refs/heads/evil", "+refs/heads/main:refs/heads/evil", "refs/heads/*:refs/heads/*", "--upload-pack=touch /tmp/x"} {
		err := r.Fetch(ctx, Owner, "file://"+src, ref, strings.Repeat("b", 40))
		if !errors.Is(err, ErrRefused) {
			t.Errorf("ref %q: %v, want refused", ref, err)
		}
	}
	if out := gitIn(t, r.Dir, "for-each-ref"); out != "" {
		t.Errorf("the mirror has refs:\n%s", out)
	}
	if _, err := r.Branch(ctx, "file://"+src, "main:refs/heads/evil"); !errors.Is(err, ErrRefused) {
		t.Errorf("base branch with a colon: %v, want refused", err)
	}
	if err := r.Fetch(ctx, Owner, "file://"+src, "refs/heads/main", "--upload-pack=x"); !errors.Is(err, ErrRefused) {
		t.Errorf("commit that is an option: %v, want refused", err)
	}
}

// TestGitEnvironment: git and its transports get nothing of the
// daemon's environment but PATH: no ssh agent, no proxy, no HOME and no
// global config (so no credential helper and no url rewrite).
func TestGitEnvironment(t *testing.T) {
	bin := t.TempDir()
	dump := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(filepath.Join(bin, "ssh"), []byte("#!/bin/sh\nenv > "+dump+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	src, commit := source(t, map[string]string{"a.txt": "x\n"})
	home := t.TempDir()
	gitconfig := "[credential]\n\thelper = store\n[url \"file://" + src + "\"]\n\tinsteadOf = https://127.0.0.1:1/r.git\n"
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte(gitconfig), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	t.Setenv("HOME", home)
	t.Setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
	t.Setenv("HTTPS_PROXY", "http://proxy.internal:3128")
	t.Setenv("http_proxy", "http://proxy.internal:3128")
	ctx := context.Background()

	r := open(t, Options{}, "k")
	_ = r.Fetch(ctx, Owner, "ssh://git.example.com/r.git", "refs/heads/main", strings.Repeat("c", 40))
	b, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	env := "\n" + string(b)
	for _, bad := range []string{"SSH_AUTH_SOCK=", "HTTPS_PROXY=", "http_proxy=", "HOME=" + home + "\n"} {
		if strings.Contains(env, "\n"+bad) {
			t.Errorf("git's transport got %s from the daemon's environment", strings.TrimSpace(bad))
		}
	}
	for _, want := range []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "GIT_ALLOW_PROTOCOL=ssh"} {
		if !strings.Contains(env, "\n"+want+"\n") {
			t.Errorf("git's transport environment lacks %s:\n%s", want, b)
		}
	}
	// The daemon user's url rewrite does not turn an https source into a
	// local one, even with local sources allowed.
	r = open(t, Options{Policy: Policy{AllowLocal: true}}, "k")
	if err := r.Fetch(ctx, Owner, "https://127.0.0.1:1/r.git", "refs/heads/main", commit); err == nil {
		t.Error("the daemon user's ~/.gitconfig rewrote the source")
	}
}

// TestWorkflowLimits: too many workflow files, or one too large, is
// refused from the listing, naming the limit, before a file is read.
func TestWorkflowLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	small := "on: [push]\nsteps:\n  - name: s\n    run: echo\n"
	big := "on: [push]\nsteps:\n  - name: s\n    run: echo " + strings.Repeat("x", 4096) + "\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"size", map[string]string{".knotless/workflows/big.yaml": big}, "--max-workflow-bytes"},
		{"count", map[string]string{".knotless/workflows/a.yaml": small, ".knotless/workflows/b.yml": small, ".knotless/workflows/c.yaml": small}, "--max-workflows"},
		{"within", map[string]string{".knotless/workflows/a.yaml": small, ".knotless/workflows/b.yml": small, ".knotless/workflows/notes.txt": big}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src, commit := source(t, tc.files)
			r := open(t, Options{Policy: Policy{AllowLocal: true}, MaxWorkflowBytes: 1024, MaxWorkflows: 2}, "k")
			if err := r.Fetch(ctx, Owner, "file://"+src, "refs/heads/main", commit); err != nil {
				t.Fatal(err)
			}
			wfs, _, err := r.Workflows(ctx, commit)
			switch {
			case tc.want == "" && (err != nil || len(wfs) != 2):
				t.Errorf("got %d workflows, %v; want 2", len(wfs), err)
			case tc.want != "" && (!errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want a refusal naming %s", err, tc.want)
			}
		})
	}
}

// TestExportLimit: a tree larger than --max-checkout is refused
// before anything is written.
func TestExportLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, commit := source(t, map[string]string{"big.bin": strings.Repeat("x", 4096), "dir/small.txt": "x\n"})
	r := open(t, Options{Policy: Policy{AllowLocal: true}, MaxCheckoutBytes: 4000}, "k")
	if err := r.Fetch(ctx, Owner, "file://"+src, "refs/heads/main", commit); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "checkout")
	err := r.Export(ctx, commit, out)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "--max-checkout") {
		t.Errorf("got %v, want a refusal naming --max-checkout", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("the refused export wrote its directory")
	}
	if err := r.Export(ctx, "--output=/tmp/x", out); !errors.Is(err, ErrRefused) {
		t.Errorf("export of an option: %v, want refused", err)
	}
}

// TestFetchLocalOtherOwner: with local sources allowed, a repository
// another user owns is fetched although the daemon user's and the
// system's git config (safe.directory) are not read.
func TestFetchLocalOtherOwner(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the source to another user")
	}
	src, commit := source(t, map[string]string{"a.txt": "x\n"})
	if out, err := exec.Command("chown", "-R", "65534", src).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v %s", err, out)
	}
	r := open(t, Options{Policy: Policy{AllowLocal: true}}, "k")
	if err := r.Fetch(context.Background(), Owner, src, "refs/heads/main", commit); err != nil {
		t.Fatal(err)
	}
}
