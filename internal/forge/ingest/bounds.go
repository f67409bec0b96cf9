package ingest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"knotless.dev/run/internal/forge/pdsclient"
)

// Bounds keep one PDS from holding a reconcile: every listing task (a
// watched repository's record, a discovered account's repositories, an
// owner's pushes, an account's pulls, a lander's landings) runs under a
// deadline of its own, at most Parallel at a time in one reconcile. The
// pages and records of one listing are bounded by the Reader's
// pdsclient.ListLimits.
type Bounds struct {
	// Parallel is how many listings run at once (default
	// DefaultParallel).
	Parallel int
	// Deadline is how long one task may take, all its requests and
	// pages together (default DefaultDeadline). A task past it fails
	// like a PDS that does not answer: its host (or account) backs off.
	Deadline time.Duration
}

// Default bounds of a reconcile's listings.
const (
	DefaultParallel = 16
	DefaultDeadline = time.Minute
)

func (b Bounds) parallel() int {
	if b.Parallel <= 0 {
		return DefaultParallel
	}
	return b.Parallel
}

func (b Bounds) deadline() time.Duration {
	if b.Deadline <= 0 {
		return DefaultDeadline
	}
	return b.Deadline
}

// pool runs one reconcile's listings: at most Parallel at once across
// all of them, each under the Deadline.
type pool struct {
	sem      *semaphore.Weighted
	deadline time.Duration
}

func (b Bounds) pool() *pool {
	return &pool{sem: semaphore.NewWeighted(int64(b.parallel())), deadline: b.deadline()}
}

// each calls do(ctx, i) for i in [0, n), each in a goroutine of its own
// once the pool has room, under a context that ends after the deadline,
// and returns once every call has. do writes its result at its own
// index, and must not call each (it holds a place in the pool). When
// ctx ends, the calls not started yet are not made.
func (p *pool) each(ctx context.Context, n int, do func(ctx context.Context, i int)) {
	var wg sync.WaitGroup
	for i := range n {
		if err := p.sem.Acquire(ctx, 1); err != nil {
			break
		}
		wg.Go(func() {
			defer p.sem.Release(1)
			tctx, cancel := context.WithTimeout(ctx, p.deadline)
			defer cancel()
			do(tctx, i)
		})
	}
	wg.Wait()
}

// usable reports whether a listing's records can be used: it ended, or
// it stopped at a bound (pdsclient.BoundError), which is logged naming the
// host, the listing and the bound; what was read up to it is used (a
// PDS lists newest first, so the newest work is kept). err, when not
// usable, says which deadline passed, if one did.
func (l *Lister) usable(ctx context.Context, err error) (bool, error) {
	var be *pdsclient.BoundError
	if errors.As(err, &be) {
		l.Logger.Warn("listing stopped at its bound; what was read up to it is used", "host", be.Host, "listing", be.What,
			"bound", be.Bound, "limit", be.Limit)
		return true, nil
	}
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%w (past the listing deadline of %s)", err, l.Bounds.deadline())
	}
	return err == nil, err
}
