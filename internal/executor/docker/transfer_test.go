package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/lib/tarstream"
)

type entry struct {
	name, link string
	typ        byte
	body       string
}

func mkTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), Uname: "someone", Uid: 1000}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil && e.typ == tar.TypeReg {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func readTar(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Uname != "" {
			t.Errorf("%s keeps its owner %d %q", h.Name, h.Uid, h.Uname)
		}
		body, _ := io.ReadAll(tr)
		out = append(out, entry{h.Name, h.Linkname, h.Typeflag, string(body)})
	}
}

func TestRelayOut(t *testing.T) {
	t.Parallel()
	in := mkTar(t, []entry{
		{"outputs/", "", tar.TypeDir, ""},
		{"outputs/a.txt", "", tar.TypeReg, "a"},
		{"outputs/sub/", "", tar.TypeDir, ""},
		{"outputs/sub/link", "../a.txt", tar.TypeSymlink, ""},
		{"outputs/sub/hard", "outputs/a.txt", tar.TypeLink, ""},
	})
	var out bytes.Buffer
	if err := relayOut(context.Background(), bytes.NewReader(in), &out, "outputs", tarstream.Limits{}); err != nil {
		t.Fatal(err)
	}
	want := []entry{
		{"a.txt", "", tar.TypeReg, "a"},
		{"sub/", "", tar.TypeDir, ""},
		{"sub/link", "../a.txt", tar.TypeSymlink, ""},
		{"sub/hard", "a.txt", tar.TypeLink, ""},
	}
	if diff := cmp.Diff(readTar(t, out.Bytes()), want, cmp.AllowUnexported(entry{})); diff != "" {
		t.Errorf("relayed (-got +want):\n%s", diff)
	}
}

func TestRelayRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		out     bool // relayOut with base "outputs", else relayIn
		entries []entry
		lim     tarstream.Limits
		want    string
	}{
		{"out: entry beside the directory", true, []entry{{"outputs/", "", tar.TypeDir, ""}, {"etc/passwd", "", tar.TypeReg, "x"}}, tarstream.Limits{}, "not inside outputs"},
		{"out: climbing", true, []entry{{"outputs/../x", "", tar.TypeReg, "x"}}, tarstream.Limits{}, `".." not allowed`},
		{"out: hard link outside", true, []entry{{"outputs/h", "etc/passwd", tar.TypeLink, ""}}, tarstream.Limits{}, "points outside"},
		{"out: device", true, []entry{{"outputs/dev", "", tar.TypeChar, ""}}, tarstream.Limits{}, "not allowed"},
		{"out: too large", true, []entry{{"outputs/big", "", tar.TypeReg, strings.Repeat("x", 10000)}}, tarstream.Limits{MaxBytes: 4096}, "size limit"},
		{"in: absolute", false, []entry{{"/etc/passwd", "", tar.TypeReg, "x"}}, tarstream.Limits{}, "absolute path"},
		{"in: climbing", false, []entry{{"a/../../x", "", tar.TypeReg, "x"}}, tarstream.Limits{}, `".." not allowed`},
		{"in: escaping link", false, []entry{{"l", "../../etc", tar.TypeSymlink, ""}}, tarstream.Limits{}, "points outside"},
		{"in: absolute link", false, []entry{{"l", "/etc", tar.TypeSymlink, ""}}, tarstream.Limits{}, "points outside"},
		{"in: hard link climbing", false, []entry{{"h", "../x", tar.TypeLink, ""}}, tarstream.Limits{}, "hard link to \"../x\" points outside"},
		{"in: fifo", false, []entry{{"f", "", tar.TypeFifo, ""}}, tarstream.Limits{}, "not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := bytes.NewReader(mkTar(t, tt.entries))
			var err error
			if tt.out {
				err = relayOut(context.Background(), in, io.Discard, "outputs", tt.lim)
			} else {
				err = relayIn(context.Background(), in, io.Discard, tt.lim)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
			if strings.Contains(tt.want, "size") && !errors.Is(err, tarstream.ErrTooLarge) {
				t.Errorf("err = %v, want ErrTooLarge", err)
			}
		})
	}
}

func TestSidWriter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		writes  []string
		wantSid int
		wantOut string
	}{
		{"marker in one write", []string{"knotless-step 42\nhello\n"}, 42, "hello\n"},
		{"marker split", []string{"knotless-", "step 7", "\nout", "put"}, 7, "output"},
		{"no marker", []string{"something else\nmore"}, 0, "something else\nmore"},
		{"no newline at all", []string{"partial"}, 0, "partial"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := &step{sidKnown: make(chan struct{})}
			var out bytes.Buffer
			w := &sidWriter{st: st, w: &out}
			for _, s := range tt.writes {
				if n, err := w.Write([]byte(s)); err != nil || n != len(s) {
					t.Fatalf("write %q: %d, %v", s, n, err)
				}
			}
			w.finish()
			<-st.sidKnown
			if st.sid != tt.wantSid || out.String() != tt.wantOut {
				t.Errorf("sid %d, out %q; want %d, %q", st.sid, out.String(), tt.wantSid, tt.wantOut)
			}
		})
	}
}
