package intake

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/backoff"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/internal/parts/state"
)

// world is intake alone on the rig: its listing and mirrors the rig's,
// its checks a real checks.Keeper writing to the rig's PDS, its state a
// real state.Store, and a real scheduler whose workers do not run, so
// what intake queues stays queued (and counts for the caps).
type world struct {
	in     *Intake
	pds    *rig.PDS
	keeper *checks.Keeper
	store  *state.Store
	sched  *scheduler.Scheduler
	lister *rig.Lister
	git    *rig.Mirrors
	lander *offers
	// batches, when set, makes the rig's PDS take batches of check
	// writes too, and records them.
	batches *batchLog
	cfg     Config
	// workers is the scheduler's concurrency (0: 1).
	workers int
	facts   Facts
	ports   Ports
}

// offers records the listings handed to the lander.
type offers struct {
	mu    sync.Mutex
	snaps []*ingest.Snapshot
}

func (o *offers) Offer(s *ingest.Snapshot) { o.mu.Lock(); o.snaps = append(o.snaps, s); o.mu.Unlock() }
func (o *offers) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.snaps)
}

func newWorld(t *testing.T) *world {
	t.Helper()
	store, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w := &world{pds: &rig.PDS{}, store: store, lister: &rig.Lister{}, git: &rig.Mirrors{}, lander: &offers{}}
	w.cfg = Config{}
	w.facts = Facts{Runner: rig.Runner}
	w.build(t)
	return w
}

// build makes the parts from w's config, facts and fakes.
func (w *world) build(t *testing.T) {
	t.Helper()
	var writer checks.Writer = w.pds
	if w.batches != nil {
		writer = batchingPDS{w.pds, w.batches}
	}
	w.keeper = checks.NewKeeper(checks.NewRecorder(writer, func(key string, c forge.Check) {
		if w.in != nil {
			w.in.NoteCheck(key, c)
		}
	}), checks.Ports{Blobs: &rig.Blobs{}, Outbox: w.store}, backoff.Policy{First: 2e9, Max: 300e9}, nil)
	ex := &fakeexec.Executor{}
	w.sched = scheduler.New(scheduler.Config{Concurrency: w.workers}, scheduler.Facts{Runner: rig.Runner, Executor: executor.CapabilitiesOf(ex), RunsDir: t.TempDir(),
		LimitsAll: w.facts.LimitsAll},
		scheduler.Ports{Engine: run.New(run.Config{Executor: ex}), Checks: w.keeper, State: w.store, Mirrors: w.git, Sweeper: ex}, nil)
	w.ports = Ports{Lister: w.lister, Mirrors: w.git, Scheduler: w.sched, Checks: w.keeper, State: w.store, Lander: w.lander}
	w.in = New(w.cfg, w.facts, w.ports, slog.New(slog.DiscardHandler))
}

// reconcile runs one reconcile and fails the test on an error.
func (w *world) reconcile(t *testing.T) {
	t.Helper()
	if err := w.in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// batchingPDS is the rig's PDS taking a batch of check writes as one
// call (checks.Batcher), recorded in log.
type batchingPDS struct {
	*rig.PDS
	log *batchLog
}

type batchLog struct {
	mu      sync.Mutex
	batches [][]string
}

func (b batchingPDS) PutBatch(ctx context.Context, writes []pdsclient.Write) error {
	var keys []string
	for _, wr := range writes {
		if _, err := b.Put(ctx, wr.Collection, wr.Rkey, wr.Value); err != nil {
			return err
		}
		keys = append(keys, wr.Rkey+" "+wr.Value.(forge.Check).Status)
	}
	slices.Sort(keys)
	b.log.mu.Lock()
	b.log.batches = append(b.log.batches, keys)
	b.log.mu.Unlock()
	return nil
}

func (l *batchLog) all() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.batches)
}
