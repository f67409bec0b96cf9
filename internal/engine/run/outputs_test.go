package run

import (
	"archive/tar"
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/rules/workflow"
)

// readOutputs takes the outputs files of earlier steps from a tar
// stream a step's code could have shaped: a step number's regular file
// only, never a later step's, a link or a name that climbs; a file over
// the bound is an error, not cut short.
func TestReadOutputsIsHostileInput(t *testing.T) {
	t.Parallel()
	stream := func(entries ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range entries {
			body := h.Linkname
			if h.Typeflag == tar.TypeReg {
				h.Size = int64(len(body))
				h.Linkname = ""
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				_, _ = tw.Write([]byte(body))
			}
		}
		_ = tw.Close()
		return b.Bytes()
	}
	file := func(name, body string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Linkname: body}
	}
	got, err := readOutputs(bytes.NewReader(stream(
		&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		file("./.keep", ""),
		file("./1", "a=1\n"),
		file("02", "b=2\n"),
		file("../2", "c=3\n"),
		&tar.Header{Name: "2", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		file("3", "later\n"),
	)), 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[int][]byte{0: []byte("a=1\n")}, got); diff != "" {
		t.Errorf("outputs (-want +got):\n%s", diff)
	}
	_, err = readOutputs(bytes.NewReader(stream(file("1", strings.Repeat("x", workflow.MaxOutputBytes+1)))), 1)
	if err == nil || !strings.Contains(err.Error(), "more than 65536") {
		t.Errorf("an outputs file over the bound: %v", err)
	}
}
