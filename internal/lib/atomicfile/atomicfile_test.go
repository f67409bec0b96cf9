package atomicfile

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestWriteReplaces(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	fi, _ := os.Stat(path)
	entries, _ := os.ReadDir(dir)
	if string(b) != "new" || fi.Mode().Perm() != 0o600 || len(entries) != 1 {
		t.Errorf("content %q mode %v entries %d", b, fi.Mode(), len(entries))
	}
}

// TestWriteModeIgnoresUmask: the mode asked for is the file's, whatever
// the process's umask, and whatever mode the file had before.
func TestWriteModeIgnoresUmask(t *testing.T) {
	// Not parallel: the umask is the process's.
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "state.json")
	if err := Write(path, []byte("{}"), 0o640); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v (%v), want 0640", fi.Mode(), err)
	}
}

// TestWriteFailureLeavesOld: a rename that fails (the target is a
// directory) leaves the target and no temporary file behind.
func TestWriteFailureLeavesOld(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target := filepath.Join(dir, "taken")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "inside"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("new"), 0o600); err == nil {
		t.Fatal("Write over a non-empty directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "taken" || !entries[0].IsDir() {
		t.Errorf("left in the directory: %v", entries)
	}
	if err := Write(filepath.Join(dir, "missing", "file"), []byte("new"), 0o600); err == nil {
		t.Error("Write into a missing directory succeeded")
	}
}
