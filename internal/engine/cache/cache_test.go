package cache

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/lib/tarstream"
)

var key = Key{Repo: "at://did:plc:owner/dev.knotless.repo/r", Workflow: "ci", Path: "/cache"}

func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tarOf builds a tar stream of name=content files.
func tarOf(t *testing.T, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(files); i += 2 {
		if err := tw.WriteHeader(&tar.Header{Name: files[i], Mode: 0o644, Size: int64(len(files[i+1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[i+1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// baseOf returns the names and contents in the base a run granted a
// secret (or not) starts from, "cold" when there is none.
func baseOf(t *testing.T, s *Store, secrets bool) string {
	t.Helper()
	f, _, err := s.Base(key, secrets)
	if errors.Is(err, ErrCold) {
		return "cold"
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var out []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out = append(out, hdr.Name+"="+string(b))
	}
	return strings.Join(out, ",")
}

func save(t *testing.T, s *Store, run string, meta Layer, stream []byte) {
	t.Helper()
	if _, err := s.Save(context.Background(), key, run, meta, bytes.NewReader(stream)); err != nil {
		t.Fatalf("save %s: %v", run, err)
	}
}

func promote(t *testing.T, s *Store, run string) bool {
	t.Helper()
	ok, err := s.Promote(key, run)
	if err != nil {
		t.Fatalf("promote %s: %v", run, err)
	}
	return ok
}

func TestTrust(t *testing.T) {
	t.Parallel()
	s := open(t, Config{})
	if got := baseOf(t, s, true); got != "cold" {
		t.Fatalf("new store: base %q, want cold", got)
	}

	// A clean push (no secret, nothing tainted restored) promotes: both
	// bases follow.
	save(t, s, "push1", Layer{Order: "0001", Clean: true}, tarOf(t, "warm", "1"))
	if !promote(t, s, "push1") {
		t.Fatal("push1 not promoted")
	}
	if got, want := baseOf(t, s, true), "warm=1"; got != want {
		t.Errorf("trusted base %q, want %q", got, want)
	}
	if got, want := baseOf(t, s, false), "warm=1"; got != want {
		t.Errorf("apart base %q, want %q", got, want)
	}

	// A secret-bearing push promotes the base only: a pull never reads
	// it, even when the caller says it is clean.
	save(t, s, "push2", Layer{Order: "0002", Secrets: true, Clean: true}, tarOf(t, "warm", "2", "token", "secret"))
	promote(t, s, "push2")
	if got, want := baseOf(t, s, true), "warm=2,token=secret"; got != want {
		t.Errorf("trusted base %q, want %q", got, want)
	}
	if got, want := baseOf(t, s, false), "warm=1"; got != want {
		t.Errorf("apart base after a secret-bearing push %q, want %q", got, want)
	}
	if entries, _ := s.List(); len(entries) != 1 || entries[0].Base.Clean {
		t.Errorf("a secret-bearing push's layer is marked clean: %+v", entries)
	}

	// A pull's upper is dropped: no base sees it, and it leaves nothing.
	save(t, s, "pull1", Layer{}, tarOf(t, "warm", "poisoned"))
	if err := s.Drop(key, "pull1"); err != nil {
		t.Fatal(err)
	}
	if got := baseOf(t, s, true); strings.Contains(got, "poisoned") {
		t.Errorf("trusted base %q has the pull's layer", got)
	}
	if got := baseOf(t, s, false); strings.Contains(got, "poisoned") {
		t.Errorf("apart base %q has the pull's layer", got)
	}
	entries, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || len(entries[0].Uppers) != 0 || entries[0].Base.Run != "push2" || entries[0].Apart.Run != "push1" {
		t.Errorf("list = %+v, want base push2, apart push1, no uppers", entries)
	}
}

func TestNewerCommitWins(t *testing.T) {
	t.Parallel()
	for _, order := range [][]string{{"old", "new"}, {"new", "old"}} {
		s := open(t, Config{})
		save(t, s, "old", Layer{Order: "3kabc000000a"}, tarOf(t, "v", "old"))
		save(t, s, "new", Layer{Order: "3kabc000000b"}, tarOf(t, "v", "new"))
		for _, run := range order {
			promote(t, s, run)
		}
		if got := baseOf(t, s, true); got != "v=new" {
			t.Errorf("promoted %v: base %q, want v=new", order, got)
		}
		entries, _ := s.List()
		if len(entries) != 1 || len(entries[0].Uppers) != 0 {
			t.Errorf("promoted %v: layers left %+v", order, entries)
		}
	}
}

func TestParallelUppers(t *testing.T) {
	t.Parallel()
	s := open(t, Config{})
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			run := "run" + string(rune('a'+i))
			_, errs[i] = s.Save(context.Background(), key, run, Layer{}, bytes.NewReader(tarOf(t, "who", run)))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	entries, _ := s.List()
	if len(entries) != 1 || len(entries[0].Uppers) != 8 {
		t.Fatalf("list = %+v, want 8 uppers", entries)
	}
	for _, u := range entries[0].Uppers {
		f, err := os.Open(filepath.Join(s.keyDir(key), layersDir, u.Run, dataFile))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(f)
		_, _ = tr.Next()
		b, _ := io.ReadAll(tr)
		f.Close()
		if string(b) != u.Run {
			t.Errorf("upper %s holds %q", u.Run, b)
		}
	}
	if got := baseOf(t, s, true); got != "cold" {
		t.Errorf("no run promoted, base %q", got)
	}
}

func TestBounds(t *testing.T) {
	t.Parallel()
	big := tarOf(t, "big", strings.Repeat("x", 64<<10))
	tests := []struct {
		name    string
		cfg     Config
		stream  []byte
		wantErr error
	}{
		{name: "over --cache-max", cfg: Config{MaxBytes: 16 << 10}, stream: big, wantErr: ErrTooLarge},
		{name: "below --disk-floor", cfg: Config{DiskFloor: 1 << 30, freeSpace: func(string) (int64, error) { return 1 << 29, nil }}, stream: tarOf(t, "a", "b"), wantErr: ErrDiskFloor},
		{name: "would pass --disk-floor", cfg: Config{DiskFloor: 1 << 20, freeSpace: func(string) (int64, error) { return 1<<20 + 8<<10, nil }}, stream: big, wantErr: ErrDiskFloor},
		{name: "over the file count", cfg: Config{MaxFiles: 1}, stream: tarOf(t, "a", "1", "b", "2"), wantErr: tarstream.ErrTooManyFiles},
		{name: "within", cfg: Config{MaxBytes: 1 << 20, MaxFiles: 2, DiskFloor: 1 << 20, freeSpace: func(string) (int64, error) { return 1 << 30, nil }}, stream: big},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := open(t, tt.cfg)
			_, err := s.Save(context.Background(), key, "r1", Layer{}, bytes.NewReader(tt.stream))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("save: %v, want %v", err, tt.wantErr)
			}
			entries, _ := s.List()
			var kept int
			for _, e := range entries {
				kept += len(e.Uppers)
			}
			if want := map[bool]int{true: 1, false: 0}[tt.wantErr == nil]; kept != want {
				t.Errorf("%d layers kept, want %d", kept, want)
			}
			if tt.wantErr != nil {
				assertNoStaging(t, s)
			}
		})
	}
}

// assertNoStaging fails when a refused save left a file behind.
func assertNoStaging(t *testing.T, s *Store) {
	t.Helper()
	_ = filepath.WalkDir(s.Dir(), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Base(p) != keyFile && filepath.Base(p) != lockFile {
			t.Errorf("left in the store: %s", p)
		}
		return nil
	})
}

func TestEvictOldestFirst(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := open(t, Config{MaxTotal: 3 * 10 << 10, now: func() time.Time { return now }})
	for i, repo := range []string{"a", "b", "c", "d"} {
		now = now.Add(time.Minute)
		k := Key{Repo: repo, Workflow: "ci", Path: "/cache"}
		if _, err := s.Save(context.Background(), k, "run-"+repo, Layer{Order: string(rune('0' + i))}, bytes.NewReader(tarOf(t, "f", strings.Repeat("x", 8<<10)))); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Promote(k, "run-"+repo); err != nil {
			t.Fatal(err)
		}
	}
	// Reading a's base makes it the most recently used.
	now = now.Add(time.Minute)
	f, _, err := s.Base(Key{Repo: "a", Workflow: "ci", Path: "/cache"}, true)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	evicted, err := s.Evict("run-d")
	if err != nil {
		t.Fatal(err)
	}
	if len(evicted) != 1 || evicted[0].Key.Repo != "b" {
		t.Errorf("evicted %+v, want b's base only", evicted)
	}
	for repo, want := range map[string]bool{"a": true, "b": false, "c": true, "d": true} {
		f, _, err := s.Base(Key{Repo: repo, Workflow: "ci", Path: "/cache"}, true)
		if got := err == nil; got != want {
			t.Errorf("%s has a base: %v, want %v (%v)", repo, got, want, err)
		}
		if f != nil {
			f.Close()
		}
	}
}

// TestHostileLayers: a stream out of a hostile session is refused
// whole, and nothing of it is written anywhere.
func TestHostileLayers(t *testing.T) {
	t.Parallel()
	entry := func(hdr tar.Header, body string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		hdr.Size = int64(len(body))
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(body))
		_ = tw.Close()
		return buf.Bytes()
	}
	tests := []struct {
		name   string
		stream []byte
		want   string
	}{
		{"symbolic link to /", entry(tar.Header{Name: "root", Typeflag: tar.TypeSymlink, Linkname: "/"}, ""), "points outside"},
		{"link that climbs", entry(tar.Header{Name: "up", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}, ""), "points outside"},
		{"absolute name", entry(tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg}, "x"), "absolute path"},
		{"dot-dot name", entry(tar.Header{Name: "a/../../x", Typeflag: tar.TypeReg}, "x"), `".." not allowed`},
		{"hard link out", entry(tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../x"}, ""), "points outside"},
		{"device", entry(tar.Header{Name: "dev", Typeflag: tar.TypeChar}, ""), "is not kept"},
		{"not a tar stream", []byte(strings.Repeat("garbage!", 200)), "tar"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := open(t, Config{MaxBytes: 1 << 20})
			_, err := s.Save(context.Background(), key, "r1", Layer{}, bytes.NewReader(tt.stream))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("save: %v, want an error containing %q", err, tt.want)
			}
			assertNoStaging(t, s)
		})
	}
}

// TestHostileTree packs trees a step may leave at a cache path: a huge
// sparse file cannot fill the runner's disk, a link to / is kept as a
// link (never followed), and a cache path turned into a file or a link
// saves an empty layer.
func TestHostileTree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	packed := func(dir string) io.Reader {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarstream.Pack(ctx, dir, pw, tarstream.Limits{})) }()
		return pr
	}

	sparse := t.TempDir()
	f, err := os.Create(filepath.Join(sparse, "huge"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s := open(t, Config{MaxBytes: 4 << 20})
	if _, err := s.Save(ctx, key, "sparse", Layer{}, packed(sparse)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("huge sparse file: %v, want %v", err, ErrTooLarge)
	}
	assertNoStaging(t, s)

	rootLink := t.TempDir()
	if err := os.Symlink("/", filepath.Join(rootLink, "cache")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(ctx, key, "link-to-root", Layer{}, packed(filepath.Join(rootLink, "cache"))); err != nil {
		t.Errorf("cache path is a link to /: %v", err)
	}
	file := filepath.Join(t.TempDir(), "cache")
	if err := os.WriteFile(file, []byte("not a dir"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(ctx, key, "file", Layer{}, packed(file)); err != nil {
		t.Errorf("cache path is a file: %v", err)
	}
	entries, _ := s.List()
	for _, e := range entries {
		for _, u := range e.Uppers {
			if u.Bytes > 4<<10 {
				t.Errorf("layer %s holds %d bytes; want an empty tree", u.Run, u.Bytes)
			}
		}
	}
	// A link inside the tree to / is refused at save.
	if err := os.Symlink("/", filepath.Join(sparse, "root")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(sparse, "huge")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(ctx, key, "inner-link", Layer{}, packed(sparse)); err == nil || !strings.Contains(err.Error(), "points outside") {
		t.Errorf("link to / inside the tree: %v", err)
	}
}

func TestListRemove(t *testing.T) {
	t.Parallel()
	s := open(t, Config{})
	for _, repo := range []string{"a", "b"} {
		k := Key{Repo: repo, Workflow: "ci", Path: "go"}
		if _, err := s.Save(context.Background(), k, "run-"+repo, Layer{}, bytes.NewReader(tarOf(t, "f", "x"))); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Promote(k, "run-"+repo); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := s.Remove(Key{Repo: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0].Repo != "a" {
		t.Errorf("removed %v, want a", removed)
	}
	entries, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Key.Repo != "b" || entries[0].Base == nil || entries[0].Base.Run != "run-b" || entries[0].Bytes == 0 {
		t.Errorf("list = %+v, want b with its base", entries)
	}
}

func TestRunIDIsAFileName(t *testing.T) {
	t.Parallel()
	s := open(t, Config{})
	for _, run := range []string{"", "..", "../x", "a/b"} {
		if _, err := s.Save(context.Background(), key, run, Layer{}, bytes.NewReader(tarOf(t))); err == nil {
			t.Errorf("save with run id %q: no error", run)
		}
	}
}

// TestZeroBoundsAreTheDefaults: a store opened with no per-layer bounds
// (--cache-max 0) bounds each layer by tarstream's defaults, never by
// nothing.
func TestZeroBoundsAreTheDefaults(t *testing.T) {
	t.Parallel()
	s, err := Open(Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	got := tarstream.Limits{MaxBytes: s.cfg.MaxBytes, MaxFiles: s.cfg.MaxFiles}
	if want := (tarstream.Limits{}).Effective(); got != want {
		t.Errorf("bounds of a zero config = %+v, want %+v", got, want)
	}
}
