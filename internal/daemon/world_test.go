package daemon_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// pixel is a 1x1 PNG.
const pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

// world is the shared forge world (tests/forgeworld: one owner with one
// repository, a real local git repository served as file://, one runner
// account, a reader) and what the daemon under test keeps.
type world struct {
	*forgeworld.World
	t         *testing.T
	stateDir  string
	cacheDir  string
	shellRoot string
	checkLog  *checkLog
	logs      *bytes.Buffer
	logsMu    sync.Mutex
}

func newWorld(t *testing.T) *world {
	t.Helper()
	needPDS(t)
	return newWorldOn(t, srv)
}

// newWorldOn is newWorld on a PDS of the test's own.
func newWorldOn(t *testing.T, srv *pds.Server) *world {
	t.Helper()
	return &world{
		World:     forgeworld.New(t, srv, forgeworld.Options{}),
		t:         t,
		stateDir:  t.TempDir(),
		cacheDir:  t.TempDir(),
		shellRoot: t.TempDir(),
		checkLog:  &checkLog{},
		logs:      &bytes.Buffer{},
	}
}

func (w *world) config(mod ...func(*daemon.Config)) daemon.Config {
	log := slog.New(slog.NewTextHandler(lockedWriter{w}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := daemon.Config{
		Account:   daemon.Account{Runner: w.Runner.DID, PDS: w.Server.URL, Password: w.Password, Directory: w.Server.Directory()},
		Sources:   daemon.Sources{Targets: []ingest.Target{{Owner: syntax.AtIdentifier(w.Owner.DID), Name: "hello"}}},
		Intake:    intake.Config{Poll: 300 * time.Millisecond},
		Engine:    run.Config{Executor: shell.New(shell.Config{Root: w.shellRoot})},
		Scheduler: scheduler.Config{Concurrency: 1},
		StopWait:  time.Minute,
		StateDir:  w.stateDir,
		CacheDir:  w.cacheDir,
		OnCheck:   w.checkLog.add,
		Logger:    log,
		// The test's sources are local repositories.
		Git: mirror.Options{Policy: mirror.Policy{AllowLocal: true}},
		// The tests run pulls, discovery and the merge queue on the
		// shell executor, on purpose (daemon.Config.Validate).
		UnsafeShellUntrusted: true,
	}
	for _, m := range mod {
		m(&cfg)
	}
	return cfg
}

type lockedWriter struct{ w *world }

func (l lockedWriter) Write(p []byte) (int, error) {
	l.w.logsMu.Lock()
	defer l.w.logsMu.Unlock()
	return l.w.logs.Write(p)
}

func (w *world) logText() string {
	w.logsMu.Lock()
	defer w.logsMu.Unlock()
	return w.logs.String()
}

// start runs the daemon until the returned stop is called.
func (w *world) start(cfg daemon.Config) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, cfg) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	w.t.Cleanup(func() {
		if err := stop(); err != nil {
			w.t.Errorf("daemon: %v", err)
		}
		if w.t.Failed() {
			w.t.Logf("daemon log:\n%s", w.logText())
		}
	})
	return stop
}

// checkLog records every check write, in order.
type checkLog struct {
	mu     sync.Mutex
	writes []checkWrite
}

type checkWrite struct {
	key   string
	check forge.Check
}

func (c *checkLog) add(key string, ch forge.Check) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, checkWrite{key, ch})
}

// statuses lists the statuses written for workflow on commit, in order.
func (c *checkLog) statuses(workflow, commit string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, w := range c.writes {
		if w.check.Workflow == workflow && w.check.Subject.Commit == commit {
			out = append(out, w.check.Status)
		}
	}
	return out
}

// waitFinal waits for a final check of workflow on commit in the
// runner's repo on the PDS, and returns it.
func (w *world) waitFinal(workflow, commit string, timeout time.Duration) (string, forge.Check) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		recs := w.Checks()
		for _, r := range recs {
			if r.Value.Workflow == workflow && r.Value.Subject.Commit == commit && r.Value.Final() {
				return r.URI.RecordKey().String(), r.Value
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no final check of %s on %s after %s; checks: %+v\nlog:\n%s", workflow, commit, timeout, recs, w.logText())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func workflowFile(body string) string { return strings.TrimLeft(body, "\n") }

var imageStep = fmt.Sprintf(`echo %s | base64 -d > "$KNOTLESS_RUN_OUTPUTS/pixel.png"`, pixel)

var _ = base64.StdEncoding
