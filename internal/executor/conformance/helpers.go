package conformance

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// cancelWriter is a run's live log that cancels the run once the log
// shows on.
type cancelWriter struct {
	on     string
	cancel context.CancelFunc
	mu     sync.Mutex
	buf    bytes.Buffer
	done   bool
}

func (w *cancelWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && bytes.Contains(w.buf.Bytes(), []byte(w.on)) {
		w.done = true
		w.cancel()
	}
	return len(p), nil
}

func (w *cancelWriter) fired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done
}

func tarOne(w io.Writer, name, content string) error {
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write([]byte(content)); err != nil {
		return err
	}
	return tw.Close()
}

func mustWrite(t *testing.T, name, content string, mode os.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(name), 0o755))
	must(t, os.WriteFile(name, []byte(content), mode))
	must(t, os.Chmod(name, mode))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
