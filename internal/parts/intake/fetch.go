package intake

import (
	"context"
	"fmt"
	"time"

	"knotless.dev/run/internal/lib/backoff"
	"knotless.dev/run/internal/rules/work"
)

// SourceCheck is the workflow name of the error check a push or pull
// gets when its commit cannot be fetched: no workflow file can be read.
const SourceCheck = "source"

// attempts are the failed fetches of one event.
type attempts struct {
	tries int
	next  time.Time
}

// fetchDue reports whether an event whose commit did not fetch may be
// tried again now.
func (in *Intake) fetchDue(ev work.Event) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	a, ok := in.fetches[ev.Key()]
	return !ok || !time.Now().Before(a.next)
}

// fetched forgets the failures of an event whose commit fetched.
func (in *Intake) fetched(ev work.Event) {
	in.mu.Lock()
	delete(in.fetches, ev.Key())
	in.mu.Unlock()
}

// fetchFailed counts a failed fetch. After FetchTries tries, with
// backoff between them, the event gets one final error check saying the
// commit is not in the source, and is done.
func (in *Intake) fetchFailed(ctx context.Context, ev work.Event, source string, err error) error {
	in.mu.Lock()
	a, ok := in.fetches[ev.Key()]
	if !ok {
		a = &attempts{}
		in.fetches[ev.Key()] = a
	}
	a.tries++
	tries := a.tries
	wait := backoff.Policy{First: in.cfg.FetchBackoff, Max: time.Hour}.After(tries)
	a.next = time.Now().Add(wait)
	in.mu.Unlock()
	if tries < in.cfg.FetchTries {
		return fmt.Errorf("fetch %s (try %d of %d, next in %s): %w", ev.Commit, tries, in.cfg.FetchTries, wait.Round(time.Second), err)
	}
	in.log.Error("commit not fetched; the event gets an error check and is not tried again", "event", ev.URI.String(), "commit", ev.Commit, "tries", tries, "err", err)
	in.refused(ev, SourceCheck)
	in.p.Checks.Error(ctx, ev, SourceCheck, fmt.Sprintf("commit %s is not in the source %s (tried %d times): %v", ev.Commit, source, tries, err))
	in.fetched(ev)
	in.markDone(ev)
	return nil
}
