package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"knotless.dev/run/internal/engine/cache"
)

// TestRunCacheDir: two runs with --cache-dir share a cache, cache ls
// shows it and cache rm clears it.
func TestRunCacheDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	checkout, cacheDir := filepath.Join(dir, "checkout"), filepath.Join(dir, "cache")
	if err := os.MkdirAll(checkout, 0o755); err != nil {
		t.Fatal(err)
	}
	wf := filepath.Join(dir, "ci.yaml")
	if err := os.WriteFile(wf, []byte("on: push\ncache: [cache]\nsteps:\n  - name: use\n    run: |\n      cat cache/warm 2>/dev/null || echo no-warm-file\n      echo from-the-first-run > cache/warm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runOnce := func() string {
		t.Helper()
		r := runCLI(t, nil, "run", "--executor", "shell", "--shell-root", filepath.Join(dir, "runs"),
			"--workflow", wf, "--workdir", checkout, "--cache-dir", cacheDir)
		if r.code != ExitSuccess {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	if out := runOnce(); !strings.Contains(out, "no-warm-file") || !strings.Contains(out, "cache cache: cold") {
		t.Errorf("first run:\n%s", out)
	}
	if out := runOnce(); !strings.Contains(out, "from-the-first-run") || !strings.Contains(out, "cache cache: restored") {
		t.Errorf("second run:\n%s", out)
	}
	r := runCLI(t, nil, "cache", "ls", "--cache-dir", cacheDir)
	if r.code != ExitSuccess || !strings.Contains(r.stdout, checkout+"  ci        cache  3072") {
		t.Errorf("cache ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout, "tainted") {
		t.Errorf("cache ls calls the cache of a run granted no secret tainted:\n%s", r.stdout)
	}
	// A layer saved by a run granted a secret is tainted, and says so.
	store, err := CacheFlags{}.openCaches(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	key := cache.Key{Repo: "at://did:plc:owner/dev.knotless.repo/hello", Workflow: "ci", Path: "cache"}
	var tarball bytes.Buffer
	if err := tar.NewWriter(&tarball).Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Save(context.Background(), key, "with-secret", cache.Layer{Order: "1", Secrets: true, Clean: cache.Clean(true, nil)}, &tarball); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Promote(key, "with-secret"); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, "cache", "ls", "--cache-dir", cacheDir)
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "with-secret tainted") {
		t.Errorf("cache ls does not call the layer of a run granted a secret tainted: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, nil, "cache", "rm", "--cache-dir", cacheDir, "--all")
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "removed "+checkout+" ci cache") {
		t.Errorf("cache rm: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if out := runOnce(); !strings.Contains(out, "no-warm-file") {
		t.Errorf("after cache rm:\n%s", out)
	}
	if r := runCLI(t, nil, "cache", "rm", "--cache-dir", cacheDir); r.code != ExitConfig {
		t.Errorf("cache rm without --repo or --all: exit %d", r.code)
	}
}
