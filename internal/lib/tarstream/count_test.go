package tarstream_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"knotless.dev/run/internal/lib/tarstream"
)

func TestCounting(t *testing.T) {
	r := &tarstream.CountingReader{R: strings.NewReader("hello, world")}
	var buf bytes.Buffer
	w := &tarstream.CountingWriter{W: &buf}
	if _, err := io.CopyBuffer(w, r, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	if r.N != 12 || w.N != 12 || buf.String() != "hello, world" {
		t.Errorf("read %d, wrote %d (%q); want 12 and 12", r.N, w.N, buf.String())
	}
}
