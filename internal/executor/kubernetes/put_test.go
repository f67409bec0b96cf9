package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"knotless.dev/run/internal/lib/tarstream"
)

// A Put's stream reaches the pod as the same entries, then the closing
// mark and no end-of-archive blocks, in writes of putBlock bytes.
func TestCloseWithMark(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	for name, body := range map[string]string{"a/one": "1", "a/two": strings.Repeat("2", 100000), "three": ""} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a/one", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	if err := tarstream.Pack(context.Background(), src, &in, tarstream.Limits{}); err != nil {
		t.Fatal(err)
	}
	w := &writeSizes{}
	if err := closeWithMark(bytes.NewReader(in.Bytes()), w, ".knotless-put-x"); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(w.buf.Bytes()))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
	if got := strings.Join(names, ","); got != "a/,a/one,a/two,link,three,.knotless-put-x" {
		t.Errorf("entries %s", got)
	}
	if tail := w.buf.Bytes()[w.buf.Len()-512:]; !bytes.Equal(tail[:len(".knotless-put-x")], []byte(".knotless-put-x")) {
		t.Errorf("the stream does not end with the mark's header (no end-of-archive blocks after it)")
	}
	dst := t.TempDir()
	if err := tarstream.Unpack(context.Background(), bytes.NewReader(w.buf.Bytes()), dst, tarstream.Limits{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a/two")); err != nil || len(b) != 100000 {
		t.Errorf("a/two: %d bytes, %v", len(b), err)
	}
	if len(w.sizes) < 3 {
		t.Fatalf("%d writes, want the stream in several blocks", len(w.sizes))
	}
	for i, n := range w.sizes[:len(w.sizes)-1] {
		if n != putBlock {
			t.Errorf("write %d of %d is %d bytes, want %d (all but the last)", i, len(w.sizes), n, putBlock)
		}
	}
	if err := closeWithMark(strings.NewReader("not a tar stream at all, and longer than one block"+strings.Repeat(".", 600)), io.Discard, "m"); err == nil {
		t.Error("a stream that is not tar was sent")
	}
}

type writeSizes struct {
	buf   bytes.Buffer
	sizes []int
}

func (w *writeSizes) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return w.buf.Write(p)
}

func TestPutMark(t *testing.T) {
	t.Parallel()
	if m := putMark("/"); !strings.HasPrefix(m, "knotless/transfer/.knotless-put-") {
		t.Errorf("mark of a put at / = %q, want it in the transfer volume", m)
	}
	if m := putMark("/cache"); !strings.HasPrefix(m, ".knotless-put-") || strings.Contains(m, "/") {
		t.Errorf("mark of a put at /cache = %q, want it at the top", m)
	}
	if a, b := putMark("/work"), putMark("/work"); a == b {
		t.Error("two puts drew the same mark")
	}
}
