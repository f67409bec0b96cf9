package mirror

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func commitFiles(t *testing.T, dir string, files map[string]string) string {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitIn(t, dir, "add", "-A")
	gitIn(t, dir, "commit", "--quiet", "-m", "c")
	return gitIn(t, dir, "rev-parse", "HEAD")
}

func TestFetchMergeExport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := t.TempDir()
	gitIn(t, src, "init", "--quiet", "--initial-branch=main")
	base := commitFiles(t, src, map[string]string{
		"a.txt":                          "one\n",
		".knotless/workflows/build.yaml": "on: [push, pull]\nsteps:\n  - name: s\n    run: cat a.txt\n",
		".knotless/workflows/bad.yaml":   "on: [nothing]\n",
	})
	gitIn(t, src, "checkout", "--quiet", "-b", "clean")
	clean := commitFiles(t, src, map[string]string{"b.txt": "two\n"})
	gitIn(t, src, "checkout", "--quiet", "-b", "clash", base)
	clash := commitFiles(t, src, map[string]string{"a.txt": "clash\n"})
	gitIn(t, src, "checkout", "--quiet", "main")
	commitFiles(t, src, map[string]string{"a.txt": "main moved\n"})

	m, err := New(t.TempDir(), Options{Policy: Policy{AllowLocal: true}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Open(ctx, "at://did:plc:x/dev.knotless.repo/hello")
	if err != nil {
		t.Fatal(err)
	}
	url := "file://" + src
	if err := r.Fetch(ctx, Owner, url, "refs/heads/clean", clean); err != nil {
		t.Fatal(err)
	}
	if err := r.Fetch(ctx, Owner, url, "refs/heads/main", strings.Repeat("0", 40)); err == nil {
		t.Error("fetched a commit that does not exist")
	}
	wfs, bad, err := r.Workflows(ctx, clean)
	if err != nil || len(wfs) != 1 || wfs[0].Name != "build" || len(bad) != 1 {
		t.Fatalf("workflows: %v, bad %v, %v", wfs, bad, err)
	}
	mainCommit, err := r.Branch(ctx, url, "main")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Branch(ctx, url, "nope"); !errors.Is(err, ErrNoBranch) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("a branch the source lacks: %v, want ErrNoBranch naming it", err)
	}
	tree, err := r.Merge(ctx, mainCommit, clean)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "checkout")
	if err := r.Export(ctx, tree, out); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a.txt": "main moved\n", "b.txt": "two\n"} {
		if b, _ := os.ReadFile(filepath.Join(out, name)); string(b) != want {
			t.Errorf("%s: %q, want %q", name, b, want)
		}
	}
	if err := r.Fetch(ctx, Owner, url, "refs/heads/clash", clash); err != nil {
		t.Fatal(err)
	}
	_, err = r.Merge(ctx, mainCommit, clash)
	var ce *ConflictError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "a.txt") {
		t.Errorf("merge of a clash: %v, want a conflict naming a.txt", err)
	}
	if _, err := os.Stat(filepath.Join(r.Dir, "index")); err == nil {
		t.Error("the mirror got an index")
	}
}

func gitCheckRefFormat(t *testing.T, ref string) bool {
	t.Helper()
	return exec.Command("git", "check-ref-format", ref).Run() == nil
}
