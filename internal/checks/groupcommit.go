package checks

import (
	"context"
	"errors"
	"slices"
	"sync"

	"knotless.dev/run/internal/forge"
)

// Batcher writes several records in one commit of the runner's
// repository, all or none (forge.Account.PutBatch). A writer that
// cannot returns an error that errors.Is errors.ErrUnsupported.
type Batcher interface {
	PutBatch(ctx context.Context, writes []forge.Write) error
}

// groupCommit sends the check writes that wait for one another as one
// commit. A PDS commits a repository's writes one at a time (four
// concurrent writes take 3.5–4× one, one batch of four 1.4×:
// tests/pds BenchmarkCommitsOfOneRepository), so a burst of runs
// starting at once had its running checks written one after another.
//
// No write waits for a batch to fill: a write finding none in flight
// goes at once, alone (Put). The writes arriving meanwhile queue; when
// the write in flight ends, the first of them leads: it sends the whole
// queue as one commit (PutBatch) and hands the next queue to its first
// write, and so on. A batch is only a faster way to make the same
// writes: when it fails, for any reason, each of its writes is made
// alone by its own caller, as without batching.
type groupCommit struct {
	w Writer
	b Batcher // nil: every write alone

	mu       sync.Mutex
	inFlight bool
	queue    []*queuedWrite
}

type queuedWrite struct {
	write forge.Write
	lead  chan struct{} // closed: this write leads batch
	batch []*queuedWrite
	done  chan struct{} // closed: the batch was written, or alone is set
	alone bool          // the batch failed: the caller makes the write itself
}

func newGroupCommit(w Writer) *groupCommit {
	g := &groupCommit{w: w}
	if b, ok := w.(Batcher); ok {
		g.b = b
	}
	return g
}

// put writes one record, alone or in a batch with those queued beside it.
func (g *groupCommit) put(ctx context.Context, write forge.Write) error {
	g.mu.Lock()
	if g.b == nil || !g.inFlight {
		g.inFlight = g.b != nil
		g.mu.Unlock()
		err := g.alone(ctx, write)
		g.handOver()
		return err
	}
	q := &queuedWrite{write: write, lead: make(chan struct{}), done: make(chan struct{})}
	g.queue = append(g.queue, q)
	g.mu.Unlock()

	select {
	case <-q.lead:
		return g.leadBatch(ctx, q)
	case <-q.done:
	case <-ctx.Done():
		g.mu.Lock()
		if i := slices.Index(g.queue, q); i >= 0 {
			// Not taken yet: it leaves the queue unwritten. A write
			// taken into a batch is waited for, so that the caller's
			// next write of the record never overtakes it.
			g.queue = slices.Delete(g.queue, i, i+1)
			g.mu.Unlock()
			return ctx.Err()
		}
		g.mu.Unlock()
		select {
		case <-q.lead:
			return g.leadBatch(ctx, q)
		case <-q.done:
		}
	}
	if q.alone {
		return g.alone(ctx, write)
	}
	return nil
}

// leadBatch sends q's batch (q first) as one commit, tells each of its
// writes the outcome, and hands the queue over.
func (g *groupCommit) leadBatch(ctx context.Context, q *queuedWrite) error {
	g.mu.Lock()
	b := g.b
	g.mu.Unlock()
	var err error
	if len(q.batch) == 1 || b == nil {
		err = g.alone(ctx, q.write)
	} else {
		writes := make([]forge.Write, len(q.batch))
		for i, w := range q.batch {
			writes[i] = w.write
		}
		err = b.PutBatch(ctx, writes)
		if errors.Is(err, errors.ErrUnsupported) {
			g.mu.Lock()
			g.b = nil
			g.mu.Unlock()
		}
	}
	for _, w := range q.batch[1:] {
		w.alone = err != nil
		close(w.done)
	}
	g.handOver()
	if err != nil && len(q.batch) > 1 {
		return g.alone(ctx, q.write)
	}
	return err
}

// handOver ends a write in flight: the writes queued meanwhile become
// the next batch, led by the first of them, or nothing is in flight.
func (g *groupCommit) handOver() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.inFlight = false
		return
	}
	next := g.queue
	g.queue = nil
	next[0].batch = next
	close(next[0].lead)
}

func (g *groupCommit) alone(ctx context.Context, w forge.Write) error {
	_, err := g.w.Put(ctx, w.Collection, w.Rkey, w.Value)
	return err
}
