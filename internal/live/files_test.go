package live

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/output"
)

// outputs writes files into a run's outputs directory.
func outputs(t *testing.T, files map[string]int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for name, size := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, name)
	}
	return dir, paths
}

// The files kept are bounded per run (how many, how many bytes), in all
// (the run kept longest goes first) and in time; a run of a check
// replaces the files of its earlier run.
func TestFilesBounds(t *testing.T) {
	t.Parallel()
	f, err := newFiles(FilesConfig{MaxFiles: 2, MaxRunBytes: 100, MaxBytes: 150, Retention: time.Hour}, filepath.Join(t.TempDir(), "files"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	f.now = func() time.Time { return now }

	dir, paths := outputs(t, map[string]int{"a": 10, "b": 95, "c": 20, "d": 30})
	got := f.keep("check-1", "r1", dir, paths)
	// a (10) and c (20): b would pass the run's 100 bytes, d the 2 files.
	if diff := cmp.Diff([]output.File{{Path: "a", Size: 10}, {Path: "c", Size: 20}}, got); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
	rc, info, err := f.OpenFile("check-1", "c")
	if err != nil || info.Size != 20 {
		t.Fatalf("open c: %v %+v", err, info)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if len(b) != 20 {
		t.Errorf("c has %d bytes", len(b))
	}

	now = now.Add(time.Minute)
	dir, paths = outputs(t, map[string]int{"x": 100})
	f.keep("check-2", "r2", dir, paths)
	now = now.Add(time.Minute)
	dir, paths = outputs(t, map[string]int{"y": 60})
	f.keep("check-3", "r3", dir, paths)
	// 30 + 100 + 60 > 150: check-1's files (kept longest) went, then
	// check-2's.
	if f.Files("check-1") != nil || f.Files("check-2") != nil || len(f.Files("check-3")) != 1 {
		t.Errorf("after the bound on all files: %v, %v, %v", f.Files("check-1"), f.Files("check-2"), f.Files("check-3"))
	}
	if _, _, err := f.OpenFile("check-1", "a"); err != output.ErrNotFound {
		t.Errorf("a dropped file opens: %v", err)
	}

	dir, paths = outputs(t, map[string]int{"z": 1})
	f.keep("check-3", "r4", dir, paths)
	if diff := cmp.Diff([]output.File{{Path: "z", Size: 1}}, f.Files("check-3")); diff != "" {
		t.Errorf("a later run's files (-want +got):\n%s", diff)
	}
	if f.runFiles("check-3", "r3") != nil {
		t.Error("the earlier run's files are listed as its")
	}
	now = now.Add(2 * time.Hour)
	if f.Files("check-3") != nil {
		t.Error("files past retention are served")
	}
	if left, _ := os.ReadDir(f.dir); len(left) != 0 {
		t.Errorf("directories left: %v", left)
	}
}
