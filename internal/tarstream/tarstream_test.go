package tarstream

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	if diff := cmp.Diff(describe(t, src)[1:], describe(t, dst)[1:]); diff != "" {
		t.Errorf("tree after round trip (-want +got):\n%s", diff)
	}
}

type entry struct {
	name, link string
	typ        byte
	body       string
}

func archive(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body))}
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
		// Every link left behind must resolve inside the target.
		_ = filepath.WalkDir(target, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.Type()&fs.ModeSymlink == 0 {
				return nil
			}
			link, _ := os.Readlink(p)
			resolved := filepath.Join(filepath.Dir(p), link)
			if rel, err := filepath.Rel(target, resolved); err != nil || strings.HasPrefix(rel, "..") {
				t.Fatalf("link %s -> %s points outside", p, link)
			}
			return nil
		})
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
