// Package readiness publishes the daemon's readiness in a file, for a
// probe that cannot speak sd_notify (a Kubernetes readinessProbe running
// `knotless-run ready`). The daemon's notify messages drive it: READY=1
// makes the file, STATUS= lines rewrite it, STOPPING=1 removes it.
package readiness

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"

	"knotless.dev/run/internal/lib/atomicfile"
)

// readyLine is the file's first line while the daemon is ready.
const readyLine = "ready"

// DegradedMark is what the daemon's STATUS line carries while its
// executor cannot take runs (an unreachable cluster, expired credentials);
// the daemon writes it from here, so the probe and the status agree.
const DegradedMark = "executor degraded"

// File is the ready file of one daemon.
type File struct {
	path string

	mu     sync.Mutex
	ready  bool
	status string
}

// New removes what an earlier process left at path (a container
// restarted in the same pod keeps its emptyDir) and returns the file,
// absent until the daemon says READY=1.
func New(path string) (*File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("--ready-file %s: %w", path, err)
	}
	return &File{path: path}, nil
}

// Notify takes one sd_notify message of the daemon.
func (f *File) Notify(msg string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case msg == "READY=1":
		f.ready = true
	case strings.HasPrefix(msg, "STATUS="):
		f.status = strings.TrimPrefix(msg, "STATUS=")
		if !f.ready {
			return nil
		}
	case msg == "STOPPING=1":
		f.ready = false
		if err := os.Remove(f.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--ready-file %s: %w", f.path, err)
		}
		return nil
	default:
		return nil
	}
	if err := atomicfile.Write(f.path, []byte(readyLine+"\n"+f.status+"\n"), 0o644); err != nil {
		return fmt.Errorf("--ready-file: %w", err)
	}
	return nil
}

// ErrNotReady is wrapped by Check's answer for a daemon that is not ready.
var ErrNotReady = errors.New("not ready")

// Check reads the ready file at path: nil when the daemon is ready and
// its executor can take runs, else an error wrapping ErrNotReady that
// says why (the daemon is starting or stopping, or its executor is
// degraded).
func Check(path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: the daemon is starting or stopping (no %s)", ErrNotReady, path)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	first, status, _ := strings.Cut(string(b), "\n")
	status = strings.TrimSpace(status)
	if first != readyLine {
		return fmt.Errorf("%w: %s does not say %q", ErrNotReady, path, readyLine)
	}
	if strings.Contains(status, DegradedMark) {
		return fmt.Errorf("%w: %s", ErrNotReady, status)
	}
	return nil
}
