package checks

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"knotless.dev/run/internal/forge/pdsclient"
)

// Batcher writes several records in one commit of the runner's
// repository, all or none. A writer that cannot returns an error that
// errors.Is errors.ErrUnsupported.
type Batcher interface {
	PutBatch(ctx context.Context, writes []pdsclient.Write) error
}

// Swapper writes a record as a compare-and-swap and reads one back
// (pdsclient.Account): a Writer that is one has every check write made
// so, and a lost swap resolved by reading the record (Recorder.write).
type Swapper interface {
	PutSwap(ctx context.Context, w pdsclient.Write) (pdsclient.Written, error)
	Get(ctx context.Context, collection, rkey string, v any) (cid string, err error)
}

// SwapBatcher is Batcher for a Swapper (pdsclient.Account.PutBatch): a
// batch is a compare-and-swap of the whole repository, made only if its
// commit is still swapCommit.
type SwapBatcher interface {
	PutBatch(ctx context.Context, writes []pdsclient.Write, swapCommit string) (pdsclient.Written, error)
}

// errNoHead is a batch not sent: the repository's commit is not known
// yet (no write since the start), so it could not be a compare-and-swap.
var errNoHead = errors.New("the repository's commit is not known yet")

// groupCommit sends the check writes that wait for one another as one
// commit. A PDS commits a repository's writes one at a time (four
// concurrent writes take 3.5–4× one, one batch of four 1.4×:
// tests/pds BenchmarkCommitsOfOneRepository), so a burst of runs
// starting at once had its running checks written one after another.
//
// A write finding none in flight and none expected goes at once, alone
// (Put). The writes arriving meanwhile queue; when the write in flight
// ends, the first of them leads: it sends the whole queue as one commit
// (PutBatch) and hands the next queue to its first write, and so on. A
// batch is only a faster way to make the same writes: when it fails, for
// any reason, each of its writes is made alone by its own caller, as
// without batching.
//
// A write that is about to come can be expected (expect): while one is,
// the queue waits for it, at most MaxLinger, so that a burst's running
// checks, whose writes start a few milliseconds apart, go as one commit
// instead of one alone and the rest after it.
type groupCommit struct {
	w      Writer
	b      Batcher // nil: every write alone
	sw     Swapper // set: every write a compare-and-swap
	sb     SwapBatcher
	linger time.Duration

	mu sync.Mutex
	// head is the repository's commit after this writer's last write:
	// a batch's swapCommit. "" until a write says it.
	head     string
	inFlight bool
	queue    []*queuedWrite
	// expected are the writes about to come; lingering is the timer
	// that, armed while the queue waits for them, stops the wait.
	expected  map[*expectation]bool
	lingering *time.Timer
}

// MaxLinger is the longest a check write waits for expected writes.
const MaxLinger = 100 * time.Millisecond

// expectation is a write about to come: the first write of record key,
// or, with no key, the first made with the context carrying it.
type expectation struct{ key string }

type expectationKey struct{}

type queuedWrite struct {
	write pdsclient.Write
	lead  chan struct{} // closed: this write leads batch
	batch []*queuedWrite
	done  chan struct{} // closed: the batch was written, or alone is set
	alone bool          // the batch failed: the caller makes the write itself
	cid   string        // the record's CID once its batch was written ("": not told)
}

func newGroupCommit(w Writer) *groupCommit {
	g := &groupCommit{w: w, linger: MaxLinger, expected: map[*expectation]bool{}}
	if sw, ok := w.(Swapper); ok {
		g.sw = sw
		g.sb, _ = w.(SwapBatcher)
	} else if b, ok := w.(Batcher); ok {
		g.b = b
	}
	return g
}

// batching reports whether writes may go in batches. g.mu is held.
func (g *groupCommit) batching() bool { return g.b != nil || g.sb != nil }

// put writes one record, alone or in a batch with those queued beside
// it, and returns its new CID when the writer tells it ("" otherwise).
func (g *groupCommit) put(ctx context.Context, write pdsclient.Write) (string, error) {
	g.mu.Lock()
	g.meet(ctx, write.Rkey)
	if !g.batching() {
		g.mu.Unlock()
		return g.alone(ctx, write)
	}
	q := &queuedWrite{write: write, lead: make(chan struct{}), done: make(chan struct{})}
	g.queue = append(g.queue, q)
	g.kick()
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
			return "", ctx.Err()
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
	return q.cid, nil
}

// leadBatch sends q's batch (q first) as one commit, tells each of its
// writes the outcome, and hands the queue over.
func (g *groupCommit) leadBatch(ctx context.Context, q *queuedWrite) (string, error) {
	g.mu.Lock()
	b, sb, head := g.b, g.sb, g.head
	g.mu.Unlock()
	var (
		err error
		cid string
	)
	switch {
	case len(q.batch) == 1 || (b == nil && sb == nil):
		cid, err = g.alone(ctx, q.write)
	case sb != nil:
		// A compare-and-swap of the repository: it has not moved since
		// this writer's last write, so every record is as written then.
		// Any failure (another writer's commit meanwhile, too) makes
		// each write alone, as its own compare-and-swap.
		err = errNoHead
		if head != "" {
			var written pdsclient.Written
			written, err = sb.PutBatch(ctx, batchWrites(q.batch), head)
			if err == nil {
				g.setHead(written.Commit)
				for i, w := range q.batch {
					if i < len(written.CIDs) {
						w.cid = written.CIDs[i]
					}
				}
				cid = q.cid
			}
		}
	default:
		err = b.PutBatch(ctx, batchWrites(q.batch))
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
	return cid, err
}

func batchWrites(batch []*queuedWrite) []pdsclient.Write {
	writes := make([]pdsclient.Write, len(batch))
	for i, w := range batch {
		writes[i] = w.write
	}
	return writes
}

// setHead notes the repository's commit after a write of this writer.
func (g *groupCommit) setHead(commit string) {
	g.mu.Lock()
	g.head = commit
	g.mu.Unlock()
}

// handOver ends a write in flight: the writes queued meanwhile go next
// (kick).
func (g *groupCommit) handOver() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight = false
	g.kick()
}

// kick sends the queue as the next batch, led by its first write, unless
// a write is in flight or one is expected; then a timer stops the wait
// after the linger. g.mu is held.
func (g *groupCommit) kick() {
	if g.inFlight || len(g.queue) == 0 {
		return
	}
	if len(g.expected) > 0 {
		if g.lingering == nil {
			var t *time.Timer
			t = time.AfterFunc(g.linger, func() { g.lingered(&t) })
			g.lingering = t
		}
		return
	}
	if g.lingering != nil {
		g.lingering.Stop()
		g.lingering = nil
	}
	g.inFlight = true
	next := g.queue
	g.queue = nil
	next[0].batch = next
	close(next[0].lead)
}

// lingered ends a wait for expected writes that did not come in time:
// they hold nobody any more. t is the timer that fired (set under
// g.mu).
func (g *groupCommit) lingered(t **time.Timer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lingering != *t {
		return // the wait ended before
	}
	g.lingering = nil
	clear(g.expected)
	g.kick()
}

// expect expects a write: the first of record key, or, with key "", the
// first made with the context returned. done ends the expectation
// without it (it may be called more than once, and after the write).
func (g *groupCommit) expect(ctx context.Context, key string) (_ context.Context, done func()) {
	e := &expectation{key: key}
	if key == "" {
		ctx = context.WithValue(ctx, expectationKey{}, e)
	}
	g.mu.Lock()
	g.expected[e] = true
	g.mu.Unlock()
	return ctx, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.expected[e] {
			delete(g.expected, e)
			g.kick()
		}
	}
}

// meet ends the expectations a write of record rkey made with ctx
// meets. g.mu is held.
func (g *groupCommit) meet(ctx context.Context, rkey string) {
	if e, ok := ctx.Value(expectationKey{}).(*expectation); ok {
		delete(g.expected, e)
	}
	for e := range g.expected {
		if e.key == rkey {
			delete(g.expected, e)
		}
	}
}

// alone writes w by itself: as a compare-and-swap when the writer is a
// Swapper (its new CID returned), else as a plain put.
func (g *groupCommit) alone(ctx context.Context, w pdsclient.Write) (string, error) {
	if g.sw == nil {
		_, err := g.w.Put(ctx, w.Collection, w.Rkey, w.Value)
		return "", err
	}
	written, err := g.sw.PutSwap(ctx, w)
	if err != nil {
		return "", err
	}
	g.setHead(written.Commit)
	if len(written.CIDs) == 0 {
		return "", nil
	}
	return written.CIDs[0], nil
}
