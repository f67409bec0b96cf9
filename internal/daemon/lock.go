package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"knotless.dev/run/internal/lib/hostlock"
	"knotless.dev/run/internal/parts/state"
)

// InUseError is a start refused because another live process owns the
// state directory or, on an executor that runs on this host, the
// runner's DID here. The cli exits with its configuration code: a
// restart would be refused again while the other lives.
type InUseError struct{ error }

func (e InUseError) Unwrap() error { return e.error }

// locks are what one process holds for its life: its state directory
// and, with --executor docker or shell, its runner's DID on this host.
type locks struct {
	state  *state.Lock
	runner *hostlock.Lock
}

// takeLocks takes the state directory's lock (state.TakeLock), before
// anything in it is read, and with an executor of this host the
// runner's lock on this host. Both are let go when the process ends,
// or by release after the handover's final save.
func takeLocks(cfg Config) (*locks, error) {
	host, _ := os.Hostname()
	me := state.Holder{PID: os.Getpid(), Host: host, Since: time.Now().UTC(), Invocation: cfg.Invocation}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", cfg.StateDir, err)
	}
	st, err := state.TakeLock(cfg.StateDir, me)
	var held *state.HeldError
	if errors.As(err, &held) {
		return nil, InUseError{err}
	}
	if err != nil {
		return nil, err
	}
	ls := &locks{state: st}
	if !onePerHost(cfg) {
		return ls, nil
	}
	said, _ := json.Marshal(runnerHolder{Holder: me, StateDir: absolute(cfg.StateDir)})
	name := runnerLockName(cfg.Account.Runner.String())
	ls.runner, err = hostlock.Take(name, said)
	var other *hostlock.HeldError
	switch {
	case errors.As(err, &other):
		_ = ls.release()
		return nil, InUseError{heldRunner(cfg, other)}
	case errors.Is(err, hostlock.ErrUnsupported):
		cfg.Logger.Warn("a second process of this runner on this host cannot be seen on this system (Linux only)", "component", "daemon")
	case err != nil:
		_ = ls.release()
		return nil, fmt.Errorf("hold the runner's lock on this host: %w", err)
	}
	return ls, nil
}

// onePerHost says whether the runner's DID is held on this host: with
// the Docker and shell executors two processes of one runner would run
// each event twice and sweep each other's runs as orphans (the runs'
// objects are labelled by DID alone). Kubernetes is left to the cluster.
func onePerHost(cfg Config) bool {
	if cfg.Engine.Executor == nil {
		return false
	}
	switch cfg.Engine.Executor.Name() {
	case "docker", "shell":
		return true
	}
	return false
}

// runnerLockName is the runner's name on this host: a hash, as a DID
// (did:web) may be longer than a socket's name can be.
func runnerLockName(did string) string {
	sum := sha256.Sum256([]byte("knotless-run runner\n" + did))
	return "knotless-run/runner/" + hex.EncodeToString(sum[:16])
}

// runnerHolder is what the holder of the runner's lock answers.
type runnerHolder struct {
	state.Holder
	StateDir string `json:"state_dir"`
}

func heldRunner(cfg Config, held *hostlock.HeldError) error {
	var h runnerHolder
	who := fmt.Sprintf("pid %d (uid %d)", held.PID, held.UID)
	if json.Unmarshal(held.Said, &h) == nil && h.PID != 0 {
		who = fmt.Sprintf("pid %d (uid %d) with --state-dir %s", held.PID, held.UID, h.StateDir)
		if !h.Since.IsZero() {
			who += " since " + h.Since.Format(time.RFC3339)
		}
		if h.Invocation != "" {
			who += " (systemd invocation " + h.Invocation + ")"
		}
	}
	return fmt.Errorf("runner %s already has a live process on this host, %s; with --executor %s one process serves a runner on a host (two would run every event twice and remove each other's runs): stop that one, or give this one another --did",
		cfg.Account.Runner, who, cfg.Engine.Executor.Name())
}

func absolute(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// release lets both locks go: the runner's first, then the state
// directory's.
func (l *locks) release() error {
	var errs []error
	if l.runner != nil {
		errs = append(errs, l.runner.Release())
	}
	errs = append(errs, l.state.Release())
	return errors.Join(errs...)
}
