package checks

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/work"
)

// The outbox: a final check the PDS does not take (network error, 5xx,
// 429) is owed: kept in state.json, known as final in memory so the
// work is never queued again, and written by PayOwed with backoff, or
// once the PDS's rate limit resets. A new process loads the owed checks
// at start (LoadOwed) and writes them; it never runs their work again.

// owe keeps a final check the PDS did not take.
func (k *Keeper) owe(key string, ev work.Event, c forge.Check, cause error, log *slog.Logger) {
	b, err := json.Marshal(c)
	if err != nil {
		log.Error("encode owed check", "check", key, "err", err)
		return
	}
	k.mu.Lock()
	k.next[key] = k.nextTry(1)
	k.mu.Unlock()
	if err := k.outbox.Owe(key, state.Owed{Check: b, Event: ev.Key(), Since: time.Now().UTC(), Tries: 1, LastError: cause.Error()}); err != nil {
		log.Error("save state", "err", err)
	}
	log.Warn("final check not written; it is owed and written when the PDS takes it (the work does not run again)", "check", key, "status", c.Status, "err", cause)
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// nextTry is when to try the PDS again after tries failures: the
// backoff, or later when the PDS said when its rate limit resets.
func (k *Keeper) nextTry(tries int) time.Time {
	now := time.Now()
	next := now.Add(k.retry.After(tries))
	if until := k.until(); until.After(next) {
		next = until
		if k.waited != nil {
			k.waited(until.Sub(now))
		}
	}
	return next
}

// OnWait has f told each time an owed check's next write is put off
// until the PDS's rate limit resets, and for how long (the metrics).
// Call it before PayOwed runs.
func (k *Keeper) OnWait(f func(time.Duration)) { k.waited = f }

// LoadOwed makes the owed checks of an earlier process known as final,
// so their work is not run again; PayOwed writes them. An owed check
// that does not decode is forgotten.
func (k *Keeper) LoadOwed() {
	owed := k.outbox.Owed()
	n := 0
	for key, o := range owed {
		var c forge.Check
		if err := json.Unmarshal(o.Check, &c); err != nil {
			k.log.Error("owed check unreadable; forgotten", "check", key, "err", err)
			if err := k.outbox.Forgive(key); err != nil {
				k.log.Error("save state", "err", err)
			}
			continue
		}
		k.rec.Know(key, c)
		n++
	}
	if n > 0 {
		k.log.Info("final checks owed by an earlier process are written, not run again", "owed", n)
	}
}

// PayOwed writes the owed checks, and the writes the PDS's low budget
// held back once it is not low (budget.go), until ctx ends.
func (k *Keeper) PayOwed(ctx context.Context) {
	for {
		wait := min(k.PayDue(ctx), k.payDeferred(ctx))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-k.wake:
			t.Stop()
		}
	}
}

// PayDue tries the owed checks that are due and returns how long to
// wait for the next.
func (k *Keeper) PayDue(ctx context.Context) time.Duration {
	type due struct {
		key string
		o   state.Owed
	}
	var todo []due
	wait := time.Hour
	now := time.Now()
	owed := k.outbox.Owed()
	k.mu.Lock()
	for key, o := range owed {
		next := k.next[key]
		if next.After(now) {
			wait = min(wait, next.Sub(now))
			continue
		}
		todo = append(todo, due{key, o})
	}
	k.mu.Unlock()
	for _, t := range todo {
		if ctx.Err() != nil {
			return 0
		}
		var c forge.Check
		_ = json.Unmarshal(t.o.Check, &c)
		log := k.log.With("check", t.key)
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		c, err := k.rec.Final(wctx, Finish, t.key, c, log)
		cancel()
		var owed *OwedError
		if err != nil && !errors.As(err, &owed) {
			log.Error("owed check cannot be written; forgotten", "err", err)
			err = nil
		}
		var serr error
		if err == nil {
			k.mu.Lock()
			delete(k.next, t.key)
			k.mu.Unlock()
			serr = k.outbox.Paid(t.key)
		} else {
			o := t.o
			o.Tries++
			o.LastError = err.Error()
			b, _ := json.Marshal(c)
			o.Check = b
			next := k.nextTry(o.Tries)
			k.mu.Lock()
			k.next[t.key] = next
			k.mu.Unlock()
			wait = min(wait, time.Until(next))
			serr = k.outbox.Owe(t.key, o)
		}
		if serr != nil {
			log.Error("save state", "err", serr)
		}
		if err == nil {
			log.Info("owed check written", "status", c.Status, "tries", t.o.Tries+1, "owed_since", t.o.Since)
		} else {
			log.Warn("owed check still not written", "tries", t.o.Tries+1, "err", err)
		}
	}
	return max(wait, 0)
}
