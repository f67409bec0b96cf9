package checks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
)

// The PDS's write budget. Every check record is a write on the runner's
// PDS, which limits them (the hosted PDS: 5,000 points an hour, a
// create 3 points, an update 2; and 1,000 blobs a day). A run costs a
// running record (a create: a worker took it at once, Unqueued) or a
// queued and a running one (it waited), and its final record: 5 points,
// or 7 for work that waited, and one blob (its log; --log-blobs).
//
// When the PDS says little is left (RateLimits.Low: under LowBudget of
// the budget in its ratelimit-* headers), the writes that are not final
// (queued, running, released) wait: the newest of each check is kept in
// memory and written by PayOwed once the budget is back, unless the
// check moved on meanwhile (its final record, which never waits, makes
// them moot). A user then sees the check at its end, or later than it
// started; never a final check held back.

// deferredWrite is a non-final write held back: the move t of a check at
// status from (what the PDS has) to c.
type deferredWrite struct {
	t    Transition
	from Status
	c    forge.Check
	seq  uint64 // which holding back of the key this is
}

// nonFinal writes a non-final move of the check of key, or, while the
// PDS's budget is low, keeps it for later.
func (k *Keeper) nonFinal(ctx context.Context, t Transition, key string, c forge.Check, log *slog.Logger) error {
	prev, _ := k.rec.Get(key)
	if err := Allowed(t, Status(prev.Status), Status(c.Status)); err != nil {
		return fmt.Errorf("write check %s: %w", key, err)
	}
	if k.low() {
		k.mu.Lock()
		k.seq++
		k.deferred[key] = deferredWrite{t: t, from: Status(prev.Status), c: c, seq: k.seq}
		k.mu.Unlock()
		log.Info("the PDS's write budget is low: this check record waits (a final one never does)", "check", key, "status", c.Status)
		k.poke()
		return nil
	}
	k.forgetDeferred(key)
	return k.rec.Write(ctx, t, key, c)
}

// forgetDeferred drops the write of key held back: a newer one is made.
func (k *Keeper) forgetDeferred(key string) {
	k.mu.Lock()
	delete(k.deferred, key)
	k.mu.Unlock()
}

// Deferred is how many checks have a write held back.
func (k *Keeper) Deferred() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.deferred)
}

func (k *Keeper) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// deferredRetry is how often the held-back writes are looked at while
// the budget stays low.
const deferredRetry = time.Minute

// payDeferred writes the held-back writes once the budget is not low,
// each only if its check is still where it was when it was held back;
// it returns how long to wait before it looks again (an hour: nothing
// is held back).
func (k *Keeper) payDeferred(ctx context.Context) time.Duration {
	k.mu.Lock()
	n := len(k.deferred)
	k.mu.Unlock()
	if n == 0 {
		return time.Hour
	}
	if k.low() {
		return deferredRetry
	}
	k.mu.Lock()
	todo := make(map[string]deferredWrite, len(k.deferred))
	for key, d := range k.deferred {
		todo[key] = d
	}
	k.mu.Unlock()
	wait := time.Hour
	for key, d := range todo {
		if ctx.Err() != nil {
			return 0
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := k.rec.WriteFrom(wctx, d.t, key, d.from, d.c)
		cancel()
		var te *TransitionError
		switch {
		case err == nil:
			k.log.Info("held-back check record written", "check", key, "status", d.c.Status)
		case errors.Is(err, ErrMoved), errors.As(err, &te):
			// The check moved on: this write says nothing new.
		default:
			k.log.Warn("held-back check record not written; tried again", "check", key, "err", err)
			wait = deferredRetry
			continue
		}
		k.mu.Lock()
		if k.deferred[key].seq == d.seq {
			delete(k.deferred, key)
		}
		k.mu.Unlock()
	}
	return wait
}

// LogBlobs says which runs' logs their final check carries as a blob
// (--log-blobs): every run's (the default), failed runs' only, or none.
// A runner on a hosted PDS, which allows 1,000 blobs a day, keeps fewer.
type LogBlobs string

// The log blob policies.
const (
	LogBlobsAlways   LogBlobs = "always"
	LogBlobsFailures LogBlobs = "failures"
	LogBlobsNever    LogBlobs = "never"
)

// keeps reports whether the log of a run that ended status is uploaded.
func (p LogBlobs) keeps(status run.Status) bool {
	switch p {
	case LogBlobsNever:
		return false
	case LogBlobsFailures:
		return status != run.Success
	}
	return true
}
