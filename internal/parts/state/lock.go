package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// LockFile is the state directory's lock: the one live process that
// owns the directory holds an exclusive flock(2) on it, and says in it
// who it is.
const LockFile = "lock"

// Holder is who holds a lock: what the lock file says, and what a
// refused process names.
type Holder struct {
	PID   int       `json:"pid"`
	Host  string    `json:"host,omitempty"`
	Since time.Time `json:"since"`
	// Invocation is systemd's INVOCATION_ID of the holder's unit, if
	// it runs under systemd.
	Invocation string `json:"invocation,omitempty"`
}

// String names the holder for a person: "pid 123 on host h since
// 2006-01-02T15:04:05Z (systemd invocation …)".
func (h Holder) String() string {
	if h.PID == 0 {
		return "a process that has not said who it is yet"
	}
	s := fmt.Sprintf("pid %d", h.PID)
	if h.Host != "" {
		s += " on host " + h.Host
	}
	if !h.Since.IsZero() {
		s += " since " + h.Since.UTC().Format(time.RFC3339)
	}
	if h.Invocation != "" {
		s += " (systemd invocation " + h.Invocation + ")"
	}
	return s
}

// HeldError is a lock another live process holds.
type HeldError struct {
	// File is the lock file; Holder what it says of the holder (zero
	// if it has not written it yet).
	File   string
	Holder Holder
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("state directory %s is in use by another knotless-run process, %s (its lock: %s); one process owns a state directory: stop that one, or give this one another --state-dir",
		filepath.Dir(e.File), e.Holder, e.File)
}

// Lock is a held lock on a state directory.
type Lock struct {
	f *os.File
}

// TakeLock takes the lock of the state directory dir for as long as
// the process lives or until Release, and writes h into it. The lock
// is flock(2) on dir/lock: the kernel drops it when the process dies,
// however it dies (kill -9 included), so a successor takes it at once;
// the file is opened close-on-exec, so no process the holder starts (a
// step, git) keeps it after the holder is gone. The file itself is
// never removed (a removed lock file would let two processes each hold
// a lock of their own). A lock another process holds is a *HeldError
// naming that process.
func TakeLock(dir string, h Holder) (*Lock, error) {
	name := filepath.Join(dir, LockFile)
	// os.OpenFile opens with O_CLOEXEC.
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the state directory's lock: %w", err)
	}
	if err := flock(f); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{File: name, Holder: readHolder(f)}
		}
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	b, _ := json.Marshal(h)
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(append(b, '\n'), 0)
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("say who holds %s: %w", name, err)
	}
	return &Lock{f: f}, nil
}

func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// readHolder reads who holds the lock of f; a holder that has not
// written it yet (it took the lock a moment ago) is the zero Holder.
func readHolder(f *os.File) Holder {
	var h Holder
	b := make([]byte, 4096)
	n, _ := f.ReadAt(b, 0)
	_ = json.Unmarshal(b[:n], &h)
	return h
}

// Release lets the lock go: the process is done with the directory
// (its state saved). The file stays, saying who held it last.
func (l *Lock) Release() error {
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("release the state directory's lock: %w", err)
	}
	return nil
}
