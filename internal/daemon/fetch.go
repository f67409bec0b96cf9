package daemon

import (
	"context"
	"fmt"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
)

// SourceCheck is the workflow name of the error check a push or pull
// gets when its commit cannot be fetched: no workflow file can be read.
const SourceCheck = "source"

// fetchDue reports whether an event whose commit did not fetch may be
// tried again now.
func (d *Daemon) fetchDue(ev ingest.Event) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	a, ok := d.faults.fetches[ev.Key()]
	return !ok || !time.Now().Before(a.next)
}

// fetched forgets the failures of an event whose commit fetched.
func (d *Daemon) fetched(ev ingest.Event) {
	d.mu.Lock()
	delete(d.faults.fetches, ev.Key())
	d.mu.Unlock()
}

// fetchFailed counts a failed fetch. After Retry.FetchTries tries, with
// backoff between them, the event gets one final error check saying the
// commit is not in the source, and is done.
func (d *Daemon) fetchFailed(ctx context.Context, ev ingest.Event, source string, err error) error {
	d.mu.Lock()
	a, ok := d.faults.fetches[ev.Key()]
	if !ok {
		a = &attempts{}
		d.faults.fetches[ev.Key()] = a
	}
	a.tries++
	tries := a.tries
	wait := backoff(d.cfg.Retry.FetchBackoff, time.Hour, tries)
	a.next = time.Now().Add(wait)
	d.mu.Unlock()
	if tries < d.cfg.Retry.FetchTries {
		return fmt.Errorf("fetch %s (try %d of %d, next in %s): %w", ev.Commit, tries, d.cfg.Retry.FetchTries, wait.Round(time.Second), err)
	}
	d.log.Error("commit not fetched; the event gets an error check and is not tried again", "event", ev.URI.String(), "commit", ev.Commit, "tries", tries, "err", err)
	d.finalError(ctx, ev, SourceCheck, fmt.Sprintf("commit %s is not in the source %s (tried %d times): %v", ev.Commit, source, tries, err))
	d.fetched(ev)
	d.markDone(ev)
	return nil
}

// ownCheck reports whether a change is one of the runner's own check
// writes, which never make work and must not wake the reconciler.
func (d *Daemon) ownCheck(c ingest.Change) bool {
	return c.DID == d.cfg.Runner && c.Collection == forge.CollectionCheck
}
