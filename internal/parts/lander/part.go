package lander

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/mergequeue"
	"knotless.dev/run/internal/rules/work"
)

// DefaultBatch is the most pulls a batch takes when Config.Batch sets
// none (serve's --queue-batch).
const DefaultBatch = 8

// Config is the operator's part of the lander.
type Config struct {
	// Queue makes the runner land the merge queue of the repositories
	// whose lander it is (--queue); without it there is no lander.
	Queue bool
	// Batch is the most pulls one batch takes (at least 1: serve's
	// --queue-batch, DefaultBatch by default): a long queue lands in
	// several batches, each a merge and a run of bounded size.
	Batch int
}

// Records are the merge queue's records, all the lander reads and
// writes besides checks: the owner's queue entries, the queued pulls,
// and the lander's own batches, ejections and landings.
type Records interface {
	Entries(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.QueueEntry], []forge.Invalid, error)
	// Pull reads a pull record; pdsclient.ErrNotFound when it is gone.
	Pull(ctx context.Context, uri syntax.ATURI) (forge.Pull, error)
	Batches(ctx context.Context) ([]forge.Record[forge.Batch], []forge.Invalid, error)
	Ejections(ctx context.Context) ([]forge.Record[forge.Ejection], []forge.Invalid, error)
	// Put writes one of the lander's own records (a batch, an ejection
	// or a landing).
	Put(ctx context.Context, collection, rkey string, v any) (syntax.ATURI, error)
}

// Intake takes the lander's pre-flights and batches as events
// (intake.Intake), and prepares a pre-flight's merge.
type Intake interface {
	Consider(ctx context.Context, ev work.Event) error
	Prepare(ctx context.Context, ev work.Event) (job.Repo, string, *mirror.ConflictError, error)
}

// Checks says what the checks of some work say together
// (checks.Keeper).
type Checks interface {
	Verdict(subject forge.Subject, workflows []string) (checks.Verdict, string)
}

// State keeps the lander's memory of a repository (a bisection) in
// state.json (state.Store).
type State interface {
	Lander(repo string) json.RawMessage
	SetLander(repo string, raw json.RawMessage) error
}

// Observer is told what the lander did (metrics); nil is told nothing.
type Observer interface {
	// Ejected: a pull left the queue, for reason (forge.Eject*).
	Ejected(repo, reason string)
	// Landed: a batch of pulls was pushed and recorded.
	Landed(repo string, pulls int)
}

// Ports are what the lander uses of the outside.
type Ports struct {
	Records Records
	Mirrors job.Mirrors
	Intake  Intake
	Checks  Checks
	State   State
	// Wake asks intake for a reconcile soon (the next step of a queue
	// can go now, not at the next poll).
	Wake     func()
	Observer Observer
}

// Lander is the lander part.
type Lander struct {
	cfg    Config
	runner string
	p      Ports
	log    *slog.Logger
	offers chan *ingest.Snapshot // the newest listing, one slot
}

// New returns the lander of runner.
func New(cfg Config, runner syntax.DID, p Ports, log *slog.Logger) *Lander {
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if p.Wake == nil {
		p.Wake = func() {}
	}
	return &Lander{cfg: cfg, runner: runner.String(), p: p, log: log, offers: make(chan *ingest.Snapshot, 1)}
}

// Offer hands the lander a reconcile's listing. It never blocks: a
// listing not taken yet is replaced by the newer one.
func (l *Lander) Offer(snap *ingest.Snapshot) {
	for {
		select {
		case l.offers <- snap:
			return
		default:
		}
		select {
		case <-l.offers:
		default:
		}
	}
}

// Run lands the queues of the listings offered until ctx ends: one
// goroutine per repository this runner lands, each taking the newest
// record of its repository, so that one repository's slow push or
// fetch holds no other. It returns once they all have.
func (l *Lander) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	repos := map[syntax.ATURI]chan forge.Record[forge.Repo]{}
	for {
		var snap *ingest.Snapshot
		select {
		case <-ctx.Done():
			return
		case snap = <-l.offers:
		}
		for _, repo := range snap.Repos {
			if !mergequeue.IsLander(&repo.Value, l.runner) {
				continue
			}
			slot, ok := repos[repo.URI]
			if !ok {
				slot = make(chan forge.Record[forge.Repo], 1)
				repos[repo.URI] = slot
				wg.Go(func() { l.follow(ctx, slot) })
			}
			// Newest wins: a record the repository's goroutine has not
			// taken yet is replaced.
			select {
			case <-slot:
			default:
			}
			slot <- repo
		}
	}
}

// follow takes the steps of one repository's queue, each from the
// newest record offered, until ctx ends.
func (l *Lander) follow(ctx context.Context, slot <-chan forge.Record[forge.Repo]) {
	for {
		select {
		case <-ctx.Done():
			return
		case repo := <-slot:
			log := l.log.With("repo", repo.URI.String())
			if err := l.landRepo(ctx, repo, log); err != nil && ctx.Err() == nil {
				log.Error("merge queue not advanced; tried again at the next reconcile", "err", err)
			}
		}
	}
}
