package daemon

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/work"
)

// A harness is the whole daemon on the rig (internal/parts/rig): its parts
// wired as Run wires them, the outside in memory (the listing, the
// mirrors and the source behind them, the blobs, the sealed secrets,
// the merge queue's records, the check records) and the executor
// fakeexec. It drives begin and serve themselves, with no server, git
// or process. Each part is tested alone in its own package; the
// real-PDS tests (world_test.go) cover the same ground end to end.
type harness struct {
	d      *Daemon
	cfg    Config
	pds    *rig.PDS
	lister *rig.Lister
	git    *rig.Mirrors
	blobs  *rig.Blobs
	sealed *rig.Sealed
	queue  *rig.Queue
	exec   *fakeexec.Executor
	notes  *notes
}

func newHarness(t *testing.T, mod ...func(*Config)) *harness {
	t.Helper()
	h := &harness{pds: &rig.PDS{}, lister: &rig.Lister{}, git: &rig.Mirrors{}, blobs: &rig.Blobs{}, sealed: &rig.Sealed{}, queue: rig.NewQueue(),
		exec: &fakeexec.Executor{}, notes: &notes{}}
	h.cfg = Config{StateDir: t.TempDir(), CacheDir: t.TempDir(), StopWait: time.Minute, Logger: slog.New(slog.DiscardHandler),
		Account: Account{Runner: rig.Runner}, Engine: run.Config{Executor: h.exec}, Notify: h.notes.add}
	for _, m := range mod {
		m(&h.cfg)
	}
	h.cfg.defaults()
	h.d = h.wire(t)
	return h
}

// wire makes the daemon of a process on the harness's state directory
// and outside, as Run does after its login.
func (h *harness) wire(t *testing.T) *Daemon {
	t.Helper()
	store, err := state.Open(h.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	return wire(h.cfg, store, outside{lister: h.lister, mirrors: h.git, landerMirrors: h.git, blobs: h.blobs, sealed: h.sealed, records: h.queue, checks: h.pds,
		ownChecks: func(context.Context) ([]forge.Record[forge.Check], []forge.Invalid, error) {
			var out []forge.Record[forge.Check]
			for k, c := range h.pds.Checks() {
				out = append(out, forge.Record[forge.Check]{URI: rig.OwnURI(forge.CollectionCheck, k), Value: c})
			}
			return out, nil, nil
		}}, nil)
}

// serve begins h's daemon and serves it (serve).
func (h *harness) serve(t *testing.T) (stop func()) {
	t.Helper()
	if err := h.d.begin(t.Context()); err != nil {
		t.Fatal(err)
	}
	return serve(t, h.d)
}

// rewire makes h's daemon again from h.cfg, changed since.
func (h *harness) rewire(t *testing.T) {
	t.Helper()
	h.d = h.wire(t)
}

// serveUntilIdle serves h's daemon until nothing is left to do, then
// stops it.
func (h *harness) serveUntilIdle(t *testing.T) {
	t.Helper()
	stop := h.serve(t)
	synctest.Wait()
	stop()
}

// noResume is an executor that cannot resume sessions (the shell's and
// docker's kind): runs finish, or are released, in their own process.
type noResume struct{ e *fakeexec.Executor }

func (n noResume) Name() string { return n.e.Name() }
func (n noResume) Start(ctx context.Context, spec executor.Spec) (executor.Session, error) {
	return n.e.Start(ctx, spec)
}
func (n noResume) Sweep(ctx context.Context, keep []string) ([]executor.Ref, error) {
	return n.e.Sweep(ctx, keep)
}

// successor is the daemon a restarted process would be: the same state
// and cache directories, loaded from disk, on the same outside, having
// begun (adopted, swept, listed its checks).
func (h *harness) successor(t *testing.T) *Daemon {
	t.Helper()
	d := h.wire(t)
	if err := d.begin(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.d = d
	return d
}

// serve runs d.serve until the returned stop is called (a SIGTERM), or
// the test ends; stop waits for the handover.
func serve(t *testing.T, d *Daemon) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = d.serve(ctx)
		close(done)
	}()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

// final is the check of workflow on ev as last written.
func (h *harness) final(ev work.Event, workflow string) forge.Check {
	c, _ := h.d.keeper.Get(forge.CheckKey(ev.Subject(), workflow))
	return c
}

// statuses lists the statuses written for the check of workflow on ev.
func (h *harness) statuses(ev work.Event, workflow string) []string {
	return h.pds.Statuses(forge.CheckKey(ev.Subject(), workflow))
}

// saved is state.json on disk.
func (h *harness) saved(t *testing.T) *state.State {
	t.Helper()
	st, err := state.Load(h.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// notes collects sd_notify messages.
type notes struct {
	mu   sync.Mutex
	msgs []string
}

func (n *notes) add(s string) {
	n.mu.Lock()
	n.msgs = append(n.msgs, s)
	n.mu.Unlock()
}

func (n *notes) has(prefix string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range n.msgs {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}
