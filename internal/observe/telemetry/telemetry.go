// Package telemetry is what the daemon tells of itself: what its parts
// and its executor observe, turned into the runner's metrics
// (internal/observe/metrics), and what they hold, turned into the status
// document `knotless-run status` shows (internal/observe/status); and the
// listeners that serve both (Listen). The daemon wires it: the parts and
// the executor only know their own small observer interfaces.
//
// Every type here is safe for concurrent use and works with nil
// metrics (it then tells nothing, and the status still works).
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/observe/metrics"
	"knotless.dev/run/internal/observe/status"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// Parts tells M what the scheduler, the lander and intake observe: it is
// their Observer (scheduler.Observer, lander.Observer, intake.Observer).
type Parts struct {
	M *metrics.Metrics
	// Executor is the executor's name, as its Name() says (never an
	// alias): the runs' executor label.
	Executor string
}

// Queued observes a push's pickup: the time from its record (the
// refUpdate's createdAt) to its run queued. A pull's record says when
// the pull was opened, not when its head moved, so pulls (and batches,
// the lander's own) have no pickup.
func (p Parts) Queued(j *job.Job) {
	if at, ok := EventTime(j.Event); ok {
		if d := time.Since(at); d >= 0 {
			p.M.EventQueued(d)
		}
	}
}

// Started observes how long a run waited queued; an adopted run
// (queued zero) waited in another process.
func (p Parts) Started(_ *job.Job, _ string, queued time.Time) {
	if !queued.IsZero() {
		p.M.RunStarted(time.Since(queued))
	}
}

// Ended counts a run that ended with a final status; a run released
// before its session started (detached) has not ended.
func (p Parts) Ended(j *job.Job, res *run.Result) {
	switch res.Status {
	case run.Success, run.Failure, run.Error, run.Cancelled:
		p.M.RunFinished(string(res.Status), j.Event.Kind, p.Executor, res.FinishedAt.Sub(res.StartedAt))
	}
}

// Ejected counts a pull the merge queue ejected, by reason.
func (p Parts) Ejected(_, reason string) { p.M.Ejected(reason) }

// Landed counts a batch the merge queue landed.
func (p Parts) Landed(string, int) { p.M.Landed() }

// Reconciled: a reconcile ended. It has no series: a failing one is in
// the log and the status document.
func (p Parts) Reconciled(int, error) {}

// Deferred: an event waits for its author's caps, flag naming the limit.
func (p Parts) Deferred(_ work.Event, flag string) { p.M.Deferred(flag) }

// Refused: an event got one error check instead of runs.
func (p Parts) Refused(_ work.Event, reason string) { p.M.Refused(reason) }

// TickSkipped: a schedule's tick was not run.
func (p Parts) TickSkipped(reason string) { p.M.TickSkipped(reason) }

// Inherited: what was done with a run an earlier process left going.
func (p Parts) Inherited(how string) { p.M.Inherited(how) }

// Retried: a run was tried again by its workflow's retry, for reason.
func (p Parts) Retried(_ *job.Job, reason string) { p.M.Retried(reason) }

// TakenOver implements scheduler.Observer.
func (p Parts) TakenOver(after time.Duration) { p.M.TakenOver(after) }

// EventTime is when a push was made, as its record says; false for
// other events.
func EventTime(ev work.Event) (time.Time, bool) {
	if ev.Push == nil {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, ev.Push.CreatedAt)
	return at, err == nil
}

// Executor is the executor's observer (executor.Observer): it tells M
// all it is told and keeps each credential's expiry for the status.
type Executor struct {
	M *metrics.Metrics

	mu      sync.Mutex
	expires map[string]time.Time
}

// SessionReady implements executor.Observer.
func (e *Executor) SessionReady(wait time.Duration) { e.M.SessionReady(wait) }

// Transferred implements executor.Observer.
func (e *Executor) Transferred(direction string, bytes int64, d time.Duration) {
	e.M.Transferred(direction, bytes, d)
}

// Swept implements executor.Observer.
func (e *Executor) Swept(removed int, err error) { e.M.Swept(removed, err) }

// CleanupFailed implements executor.Observer.
func (e *Executor) CleanupFailed() { e.M.CleanupFailed() }

// WarmPods implements executor.Observer.
func (e *Executor) WarmPods(ready, starting int) { e.M.WarmPods(ready, starting) }

// WarmTaken implements executor.Observer.
func (e *Executor) WarmTaken() { e.M.WarmTaken() }

// FenceConflict implements executor.Observer.
func (e *Executor) FenceConflict() { e.M.FenceConflict() }

// CredentialExpiry implements executor.Observer (zero at: none known).
func (e *Executor) CredentialExpiry(credential string, at time.Time) {
	e.mu.Lock()
	if e.expires == nil {
		e.expires = map[string]time.Time{}
	}
	if at.IsZero() {
		delete(e.expires, credential)
	} else {
		e.expires[credential] = at
	}
	e.mu.Unlock()
	e.M.CredentialExpiry(credential, at)
}

// Credentials are the credentials whose expiry the executor told, by
// name.
func (e *Executor) Credentials() []status.Credential {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]status.Credential, 0, len(e.expires))
	for name, at := range e.expires {
		out = append(out, status.Credential{Name: name, Expires: at.UTC()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Outbox is the checks part's outbox (state.Store) with the owed checks
// counted in M at every change, and whenever they are read.
type Outbox struct {
	checks.Outbox
	M *metrics.Metrics
}

// Owe implements checks.Outbox.
func (o Outbox) Owe(key string, v state.Owed) error { return o.count(o.Outbox.Owe(key, v)) }

// Paid implements checks.Outbox.
func (o Outbox) Paid(key string) error { return o.count(o.Outbox.Paid(key)) }

// Forgive implements checks.Outbox.
func (o Outbox) Forgive(key string) error { return o.count(o.Outbox.Forgive(key)) }

// Owed implements checks.Outbox.
func (o Outbox) Owed() map[string]state.Owed {
	owed := o.Outbox.Owed()
	o.M.SetOwedChecks(len(owed))
	return owed
}

func (o Outbox) count(err error) error {
	o.Owed()
	return err
}

// Writer is the checks part's writer (pdsclient.Account) with the records
// the PDS (or the lexicon) refuses as invalid counted in M.
type Writer struct {
	checks.Writer
	M *metrics.Metrics
}

// PutBatch implements checks.Batcher when the writer it wraps does. A
// refused batch is not counted: its writes are made again one by one,
// and those are.
func (w Writer) PutBatch(ctx context.Context, writes []pdsclient.Write) error {
	b, ok := w.Writer.(checks.Batcher)
	if !ok {
		return fmt.Errorf("%T writes one record at a time: %w", w.Writer, errors.ErrUnsupported)
	}
	return b.PutBatch(ctx, writes)
}

// SwapWriter is Writer over a writer that writes each record as a
// compare-and-swap (checks.Swapper and checks.SwapBatcher:
// pdsclient.Account), as the checks part then writes every check.
type SwapWriter struct {
	Writer
	Swap interface {
		checks.Swapper
		checks.SwapBatcher
	}
}

// NewWriter is the checks part's writer over w, counted in m: a
// SwapWriter when w writes compare-and-swaps, else a Writer.
func NewWriter(w checks.Writer, m *metrics.Metrics) checks.Writer {
	plain := Writer{Writer: w, M: m}
	if sw, ok := w.(interface {
		checks.Swapper
		checks.SwapBatcher
	}); ok {
		return SwapWriter{Writer: plain, Swap: sw}
	}
	return plain
}

// PutSwap implements checks.Swapper.
func (w SwapWriter) PutSwap(ctx context.Context, wr pdsclient.Write) (pdsclient.Written, error) {
	out, err := w.Swap.PutSwap(ctx, wr)
	if checks.Refused(err) {
		w.M.CheckRefused()
	}
	return out, err
}

// Get implements checks.Swapper.
func (w SwapWriter) Get(ctx context.Context, collection, rkey string, v any) (string, error) {
	return w.Swap.Get(ctx, collection, rkey, v)
}

// PutBatch implements checks.SwapBatcher. A refused batch is not
// counted: its writes are made again one by one, and those are.
func (w SwapWriter) PutBatch(ctx context.Context, writes []pdsclient.Write, swapCommit string) (pdsclient.Written, error) {
	return w.Swap.PutBatch(ctx, writes, swapCommit)
}

// Put implements checks.Writer.
func (w Writer) Put(ctx context.Context, collection, rkey string, v any) (syntax.ATURI, error) {
	uri, err := w.Writer.Put(ctx, collection, rkey, v)
	if checks.Refused(err) {
		w.M.CheckRefused()
	}
	return uri, err
}
