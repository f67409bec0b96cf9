package tarstream

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// describe lists a tree as "path mode [-> link | content]" lines.
func describe(t *testing.T, dir string) []string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := rel + " " + fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

func TestRoundTripKeepsModesLinksAndEmptyDirs(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "a/empty"), 0o755))
	must(t, os.Mkdir(filepath.Join(src, "locked"), 0o555))
	must(t, os.WriteFile(filepath.Join(src, "a/run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "a/data"), []byte("data"), 0o600))
	must(t, os.Symlink("run.sh", filepath.Join(src, "a/link")))
	must(t, os.Symlink("../locked", filepath.Join(src, "a/up")))

	var buf bytes.Buffer
	must(t, Pack(context.Background(), src, &buf, Limits{}))
	dst := t.TempDir()
	must(t, Unpack(context.Background(), &buf, dst, Limits{}))
	want := describe(t, src)[1:]
	// A directory's owner keeps u+rwx (Unpack's rule): 0555 comes back 0755.
	for i, line := range want {
		want[i] = strings.Replace(line, "locked dr-xr-xr-x", "locked drwxr-xr-x", 1)
	}
	if diff := cmp.Diff(want, describe(t, dst)[1:]); diff != "" {
		t.Errorf("tree after round trip (-want +got):\n%s", diff)
	}
}

type entry struct {
	name, link string
	typ        byte
	body       string
	mode       int64 // 0 means 0644
}

func archive(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			_, _ = tw.Write([]byte(e.body))
		}
	}
	_ = tw.Close()
	return buf.Bytes()
}

func TestUnpackRefusesHostileEntries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		entries []entry
		wantErr string
	}{
		{"dotdot", []entry{{name: "../x", typ: tar.TypeReg, body: "x"}}, `tar entry "../x": ".." not allowed`},
		{"nested dotdot", []entry{{name: "a/../../x", typ: tar.TypeReg, body: "x"}}, `tar entry "a/../../x": ".." not allowed`},
		{"absolute", []entry{{name: "/etc/x", typ: tar.TypeReg, body: "x"}}, `tar entry "/etc/x": absolute path not allowed`},
		{"symlink out then file through it", []entry{
			{name: "out", typ: tar.TypeSymlink, link: "../outside"},
			{name: "out/x", typ: tar.TypeReg, body: "x"},
		}, `tar entry "out": symbolic link to "../outside" points outside the target`},
		{"absolute symlink", []entry{{name: "l", typ: tar.TypeSymlink, link: "/etc"}}, `tar entry "l": symbolic link to "/etc" points outside the target`},
		{"hardlink out", []entry{{name: "h", typ: tar.TypeLink, link: "../outside/secret"}}, `tar entry "h": hard link to "../outside/secret" points outside the target`},
		{"absolute hardlink", []entry{{name: "h", typ: tar.TypeLink, link: "/etc/passwd"}}, `tar entry "h": hard link to "/etc/passwd" points outside the target`},
		{"device", []entry{{name: "dev", typ: tar.TypeChar}}, `tar entry "dev": entry type "3" not allowed (devices, FIFOs and others are refused)`},
		{"fifo", []entry{{name: "fifo", typ: tar.TypeFifo}}, `tar entry "fifo": entry type "6" not allowed (devices, FIFOs and others are refused)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			parent := t.TempDir()
			target := filepath.Join(parent, "target")
			must(t, os.Mkdir(target, 0o755))
			must(t, os.Mkdir(filepath.Join(parent, "outside"), 0o755))
			must(t, os.WriteFile(filepath.Join(parent, "outside/secret"), []byte("s"), 0o600))
			err := Unpack(context.Background(), bytes.NewReader(archive(t, tt.entries...)), target, Limits{})
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Unpack error = %v, want %q", err, tt.wantErr)
			}
			want := []string{". drwxr-xr-x", "outside drwxr-xr-x", "outside/secret -rw------- s", "target drwxr-xr-x"}
			if diff := cmp.Diff(want, describe(t, parent)); diff != "" {
				t.Errorf("tree after refused unpack (-want +got):\n%s", diff)
			}
		})
	}
}

// A link that stays inside may be followed by a later entry only within the tree.
func TestUnpackSymlinkInsideIsReplacedNotFollowed(t *testing.T) {
	t.Parallel()
	dst := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dst, "keep"), []byte("keep"), 0o644))
	data := archive(t,
		entry{name: "l", typ: tar.TypeSymlink, link: "keep"},
		entry{name: "l", typ: tar.TypeReg, body: "new"},
	)
	must(t, Unpack(context.Background(), bytes.NewReader(data), dst, Limits{}))
	want := []string{". drwx------", "keep -rw-r--r-- keep", "l -rw-r--r-- new"}
	got := describe(t, dst)
	got[0] = ". " + strings.SplitN(got[0], " ", 2)[1]
	if diff := cmp.Diff(want[1:], got[1:]); diff != "" {
		t.Errorf("tree (-want +got):\n%s", diff)
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	data := archive(t, entry{name: "big", typ: tar.TypeReg, body: strings.Repeat("x", 10000)})
	err := Unpack(context.Background(), bytes.NewReader(data), t.TempDir(), Limits{MaxBytes: 4096})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("Unpack over limit: err = %v, want ErrTooLarge", err)
	}
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte("x"), 10000), 0o644))
	err = Pack(context.Background(), src, &bytes.Buffer{}, Limits{MaxBytes: 4096})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("Pack over limit: err = %v, want ErrTooLarge", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Unpack(ctx, bytes.NewReader(data), t.TempDir(), Limits{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Unpack after deadline: err = %v, want context.Canceled", err)
	}
}

// linksOutside lists the links under target that point outside it, read
// lexically and resolved for real through every link on the way.
func linksOutside(t testing.TB, target string) []string {
	t.Helper()
	realTarget, err := filepath.EvalSymlinks(target)
	if err != nil {
		t.Fatal(err)
	}
	outside := func(base, p string) bool {
		rel, err := filepath.Rel(base, p)
		return err != nil || rel == ".." || strings.HasPrefix(rel, "../")
	}
	var bad []string
	_ = filepath.WalkDir(target, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		link, _ := os.Readlink(p)
		if filepath.IsAbs(link) || outside(target, filepath.Join(filepath.Dir(p), link)) {
			bad = append(bad, p+" -> "+link)
		} else if resolved, err := filepath.EvalSymlinks(p); err == nil && outside(realTarget, resolved) {
			bad = append(bad, p+" -> "+link+" (resolves to "+resolved+")")
		}
		return nil
	})
	return bad
}

// Links that each stay inside can still be chained out of the tree; the
// unpacker refuses every such chain and leaves no link pointing out.
func TestUnpackLinkChainsStayInside(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		entries []entry
		wantErr string
	}{
		{"link made through a linked parent", []entry{
			{name: "d/", typ: tar.TypeDir},
			{name: "d/l", typ: tar.TypeSymlink, link: ".."},
			{name: "d/l/x", typ: tar.TypeSymlink, link: "../.."},
		}, `tar entry "d/l/x": parent "d/l" is a symbolic link`},
		{"file made through a linked parent", []entry{
			{name: "d/", typ: tar.TypeDir},
			{name: "d/l", typ: tar.TypeSymlink, link: ".."},
			{name: "d/l/f", typ: tar.TypeReg, body: "x"},
		}, `tar entry "d/l/f": parent "d/l" is a symbolic link`},
		{"climb after a link", []entry{
			{name: "d/", typ: tar.TypeDir},
			{name: "d/b", typ: tar.TypeSymlink, link: ".."},
			{name: "a", typ: tar.TypeSymlink, link: "d/b/../.."},
		}, `tar entry "a": symbolic link to "d/b/../.." climbs after descending`},
		{"climb after a part that becomes a link later", []entry{
			{name: "d/p/", typ: tar.TypeDir},
			{name: "d/a", typ: tar.TypeSymlink, link: "p/../.."},
			{name: "d/p", typ: tar.TypeSymlink, link: ".."},
		}, `tar entry "d/a": symbolic link to "p/../.." climbs after descending`},
		{"hard link to a deep symlink", []entry{
			{name: "d/e/", typ: tar.TypeDir},
			{name: "d/e/l", typ: tar.TypeSymlink, link: "../.."},
			{name: "h", typ: tar.TypeLink, link: "d/e/l"},
		}, `tar entry "h": hard link to "d/e/l" names a symbolic link`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			parent := t.TempDir()
			target := filepath.Join(parent, "target")
			must(t, os.Mkdir(target, 0o755))
			err := Unpack(context.Background(), bytes.NewReader(archive(t, tt.entries...)), target, Limits{})
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("Unpack error = %v, want %q", err, tt.wantErr)
			}
			if bad := linksOutside(t, target); len(bad) > 0 {
				t.Errorf("links pointing outside the target: %v", bad)
			}
		})
	}
}

// A tree with directories recorded as 0644 and 0000 unpacks fully and is
// removed cleanly by the user who unpacked it when that user is not
// root (the Nix sandbox's nixbld, the daemon's knotless). Run as root,
// the test runs itself, and FuzzUnpack's seeds, again as uid 65534.
func TestUnpackedTreeRemovableWithoutRoot(t *testing.T) {
	t.Parallel()
	if os.Geteuid() == 0 {
		runAsNobody(t, "^(TestUnpackedTreeRemovableWithoutRoot|FuzzUnpack)$")
		return
	}
	dst := filepath.Join(t.TempDir(), "tree")
	must(t, os.Mkdir(dst, 0o755))
	data := archive(t,
		entry{name: "rw/", typ: tar.TypeDir, mode: 0o644},
		entry{name: "rw/f", typ: tar.TypeReg, body: "f"},
		entry{name: "none/", typ: tar.TypeDir, mode: 0o1000}, // sticky only: no permission bits
		entry{name: "none/deep/g", typ: tar.TypeReg, body: "g"},
	)
	must(t, Unpack(context.Background(), bytes.NewReader(data), dst, Limits{}))
	want := []string{
		". drwxr-xr-x",
		"none drwx------",
		"none/deep drwxr-xr-x",
		"none/deep/g -rw-r--r-- g",
		"rw drwxr--r--",
		"rw/f -rw-r--r-- f",
	}
	if diff := cmp.Diff(want, describe(t, dst)); diff != "" {
		t.Errorf("unpacked tree (-want +got):\n%s", diff)
	}
	if err := os.RemoveAll(dst); err != nil {
		t.Fatalf("remove the unpacked tree: %v", err)
	}
}

// runAsNobody runs the tests matching pattern of this test binary again
// as uid and gid 65534, in a directory of its own that holds a copy of
// the binary and of testdata, and fails with the child's output if they
// fail.
func runAsNobody(t *testing.T, pattern string) {
	t.Helper()
	const nobody = 65534
	dir, err := os.MkdirTemp("", "tarstream-nonroot-")
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	exe, err := os.Executable()
	must(t, err)
	bin, err := os.ReadFile(exe)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "tarstream.test"), bin, 0o755))
	must(t, os.CopyFS(filepath.Join(dir, "testdata"), os.DirFS("testdata")))
	must(t, filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, nobody, nobody)
	}))
	cmd := exec.Command(filepath.Join(dir, "tarstream.test"), "-test.run="+pattern, "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = []string{"TMPDIR=" + dir, "HOME=" + dir, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if errors.Is(err, syscall.EPERM) {
		t.Skipf("cannot run as uid %d here (no CAP_SETUID): %v", nobody, err)
	}
	if err != nil {
		t.Fatalf("as uid %d: %v\n%s", nobody, err, out)
	}
	for _, name := range []string{"TestUnpackedTreeRemovableWithoutRoot", "FuzzUnpack/seed#2"} {
		if !strings.Contains(string(out), "--- PASS: "+name) {
			t.Errorf("as uid %d: %s did not pass:\n%s", nobody, name, out)
		}
	}
}

func FuzzUnpack(f *testing.F) {
	f.Add(archive(f, entry{name: "a/b", typ: tar.TypeReg, body: "x"}))
	f.Add(archive(f, entry{name: "l", typ: tar.TypeSymlink, link: "../x"}, entry{name: "l/f", typ: tar.TypeReg, body: "x"}))
	f.Add(archive(f, entry{name: "d/", typ: tar.TypeDir}, entry{name: "d/l", typ: tar.TypeSymlink, link: ".."}, entry{name: "d/l/f", typ: tar.TypeReg}))
	f.Add(archive(f, entry{name: "h", typ: tar.TypeLink, link: "a"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		target := filepath.Join(parent, "target")
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = Unpack(context.Background(), bytes.NewReader(data), target, Limits{MaxBytes: 1 << 20})
		entries, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "target" {
			t.Fatalf("unpack wrote outside its target: %v", entries)
		}
		// Every link left behind must resolve inside the target, also
		// through the other links.
		if bad := linksOutside(t, target); len(bad) > 0 {
			t.Fatalf("links point outside: %v", bad)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestFileAndByteLimits(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	for i := range 5 {
		must(t, os.WriteFile(filepath.Join(src, string(rune('a'+i))), bytes.Repeat([]byte("x"), 1000), 0o644))
	}
	var full bytes.Buffer
	must(t, Pack(context.Background(), src, &full, Limits{}))
	tests := []struct {
		name    string
		pack    Limits
		unpack  Limits
		wantErr error
	}{
		{"pack bytes", Limits{MaxBytes: 2048}, Limits{}, ErrTooLarge},
		{"pack files", Limits{MaxFiles: 4}, Limits{}, ErrTooManyFiles},
		{"unpack bytes", Limits{}, Limits{MaxBytes: 2048}, ErrTooLarge},
		{"unpack files", Limits{}, Limits{MaxFiles: 4}, ErrTooManyFiles},
		{"at the bounds", Limits{MaxBytes: int64(full.Len()), MaxFiles: 5}, Limits{MaxBytes: int64(full.Len()), MaxFiles: 5}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			err := Pack(context.Background(), src, &buf, tt.pack)
			if err == nil {
				err = Unpack(context.Background(), &buf, t.TempDir(), tt.unpack)
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestLimitReaderStopsAtTheBound: the consumer never gets a byte past
// MaxBytes, so nothing past the bound is written.
func TestLimitReaderStopsAtTheBound(t *testing.T) {
	t.Parallel()
	r := LimitReader(context.Background(), strings.NewReader(strings.Repeat("x", 100)), Limits{MaxBytes: 10})
	got, err := io.ReadAll(r)
	if len(got) != 10 || !errors.Is(err, ErrTooLarge) {
		t.Errorf("read %d bytes, err %v; want 10 and ErrTooLarge", len(got), err)
	}
}

// A Packer fills several directories in one stream: each tree and file
// under its own prefix, the whole stream within one set of limits.
func TestPackerPutsTreesUnderPrefixes(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "sub/f"), []byte("f"), 0o640))
	must(t, os.Symlink("sub/f", filepath.Join(src, "link")))
	var buf bytes.Buffer
	p := NewPacker(context.Background(), &buf, Limits{})
	must(t, p.Tree(src, "work"))
	must(t, p.File("steps/1", 0o755, []byte("echo one\n")))
	must(t, p.Close())
	dst := t.TempDir()
	must(t, Unpack(context.Background(), bytes.NewReader(buf.Bytes()), dst, Limits{}))
	want := []string{
		"steps drwxr-xr-x", "steps/1 -rwxr-xr-x echo one\n",
		"work drwxr-xr-x", "work/link Lrwxrwxrwx -> sub/f", "work/sub drwxr-xr-x", "work/sub/f -rw-r----- f",
	}
	if diff := cmp.Diff(want, describe(t, dst)[1:]); diff != "" {
		t.Errorf("tree (-want +got):\n%s", diff)
	}
	// The limits count the whole stream: the tree's three entries and the file.
	p = NewPacker(context.Background(), io.Discard, Limits{MaxFiles: 3})
	must(t, p.Tree(src, "work"))
	if err := p.File("steps/1", 0o755, nil); !errors.Is(err, ErrTooManyFiles) {
		t.Errorf("a fourth entry past MaxFiles 3: %v, want ErrTooManyFiles", err)
	}
}

// repeatReader reads block over and over.
type repeatReader struct {
	block []byte
	off   int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.block[r.off:])
		n += c
		r.off = (r.off + c) % len(r.block)
	}
	return n, nil
}

// Zero limits are the defaults, never no bound: an unpack with Limits{}
// refuses a stream of more entries than DefaultMaxFiles (the same
// directory entry again and again, so nothing piles up on disk), and a
// LimitReader with Limits{} a stream past DefaultMaxBytes.
func TestZeroLimitsAreTheDefaults(t *testing.T) {
	t.Parallel()
	if diff := cmp.Diff(Limits{MaxBytes: DefaultMaxBytes, MaxFiles: DefaultMaxFiles}, Limits{}.Effective()); diff != "" {
		t.Errorf("Limits{}.Effective() (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Limits{MaxBytes: 5, MaxFiles: DefaultMaxFiles}, Limits{MaxBytes: 5, MaxFiles: -1}.Effective()); diff != "" {
		t.Errorf("a negative field (-want +got):\n%s", diff)
	}

	// Without a bound these streams never end: the context ends them
	// then, and the test fails.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dir := archive(t, entry{name: "d/", typ: tar.TypeDir})
	err := Unpack(ctx, &repeatReader{block: dir[:512]}, t.TempDir(), Limits{})
	if !errors.Is(err, ErrTooManyFiles) || !strings.Contains(err.Error(), "(200000 files)") {
		t.Errorf("an endless stream of entries with zero limits: %v, want ErrTooManyFiles at the default", err)
	}

	n, err := io.Copy(io.Discard, LimitReader(ctx, &repeatReader{block: make([]byte, 1<<16)}, Limits{}))
	if !errors.Is(err, ErrTooLarge) || n != DefaultMaxBytes {
		t.Errorf("an endless stream with zero limits: read %d bytes, err %v; want %d and ErrTooLarge", n, err, DefaultMaxBytes)
	}
}

// A bound of math.MaxInt64 (no stream reaches it) reads on: no overflow
// at the room left.
func TestLimitReaderAtMaxInt64(t *testing.T) {
	t.Parallel()
	got, err := io.ReadAll(LimitReader(context.Background(), strings.NewReader("abc"), Limits{MaxBytes: math.MaxInt64}))
	if string(got) != "abc" || err != nil {
		t.Errorf("read %q, %v", got, err)
	}
	var buf bytes.Buffer
	if err := NewPacker(context.Background(), &buf, Limits{MaxBytes: math.MaxInt64}).File("f", 0o644, []byte("x")); err != nil {
		t.Errorf("pack: %v", err)
	}
}
