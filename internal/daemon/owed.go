package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"knotless.dev/run/internal/checks"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/state"
)

// Retry says how the daemon waits after a failure that is not the
// work's: a check the PDS did not take, a commit that did not fetch, an
// owner's PDS that did not answer, an executor that is unreachable.
type Retry struct {
	// Backoff is the first wait (default 2 s); each failure doubles it
	// up to MaxBackoff (default 5 min).
	Backoff    time.Duration
	MaxBackoff time.Duration
	// FetchTries is how many times a push's commit is fetched before the
	// push gets an error check instead (default 5), FetchBackoff the
	// first wait between tries (default 1 min, doubling: about 15 min in
	// all, so a source that is briefly down is not mistaken).
	FetchTries   int
	FetchBackoff time.Duration
}

func (r *Retry) defaults() {
	if r.Backoff <= 0 {
		r.Backoff = 2 * time.Second
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = 5 * time.Minute
	}
	if r.FetchTries <= 0 {
		r.FetchTries = 5
	}
	if r.FetchBackoff <= 0 {
		r.FetchBackoff = time.Minute
	}
}

// wait is the backoff after tries failures (tries ≥ 1).
func (r Retry) wait(tries int) time.Duration { return backoff(r.Backoff, r.MaxBackoff, tries) }

func backoff(first, most time.Duration, tries int) time.Duration {
	d := first
	for i := 1; i < tries && d < most; i++ {
		d *= 2
	}
	return min(d, most)
}

// faults is the daemon's memory of what failed and when to try again.
type faults struct {
	limits *rateLimits
	// owedWake is a hint that a check became owed.
	owedWake chan struct{}
	// owedNext is when each owed check is tried next (in memory: a new
	// process tries at once).
	owedNext map[string]time.Time
	// fetches counts failed fetches per event key.
	fetches map[string]*attempts
	// executorErr is why the executor cannot take runs (nil: it can);
	// swept tells whether the start-up sweep has worked (degraded.go).
	executorErr error
	swept       bool
}

type attempts struct {
	tries int
	next  time.Time
}

func (f *faults) init(hc *http.Client) *http.Client {
	f.limits = &rateLimits{until: map[string]time.Time{}}
	f.owedWake = make(chan struct{}, 1)
	f.owedNext = map[string]time.Time{}
	f.fetches = map[string]*attempts{}
	return f.limits.client(hc)
}

// putFinal writes a final check through the recorder (checks.Final).
// A check the PDS does not take now is owed: kept in state.json and
// written later, never a reason to run the work again.
func (d *Daemon) putFinal(ctx context.Context, t checks.Transition, key string, ev ingest.Event, c forge.Check, log *slog.Logger) {
	c, err := d.rec.Final(ctx, t, key, c, log)
	var owed *checks.OwedError
	switch {
	case errors.As(err, &owed):
		d.owe(key, ev, c, owed.Err, log)
	case err != nil:
		log.Error("final check not written", "check", key, "err", err)
	}
}

// owe keeps a final check the PDS did not take.
func (d *Daemon) owe(key string, ev ingest.Event, c forge.Check, cause error, log *slog.Logger) {
	b, err := json.Marshal(c)
	if err != nil {
		log.Error("encode owed check", "check", key, "err", err)
		return
	}
	d.mu.Lock()
	if d.st.Owed == nil {
		d.st.Owed = map[string]state.Owed{}
	}
	d.st.Owed[key] = state.Owed{Check: b, Event: ev.Key(), Since: time.Now().UTC(), Tries: 1, LastError: cause.Error()}
	d.faults.owedNext[key] = d.nextTry(1)
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	if err := d.sf.write(snap); err != nil {
		log.Error("save state", "err", err)
	}
	log.Warn("final check not written; it is owed and written when the PDS takes it (the work does not run again)", "check", key, "status", c.Status, "err", cause)
	select {
	case d.faults.owedWake <- struct{}{}:
	default:
	}
}

// nextTry is when to try the PDS again after tries failures: the
// backoff, or later when the PDS said when its rate limit resets.
func (d *Daemon) nextTry(tries int) time.Time {
	next := time.Now().Add(d.cfg.Retry.wait(tries))
	if d.account != nil {
		if until := d.faults.limits.limitedUntil(d.account.Host()); until.After(next) {
			next = until
		}
	}
	return next
}

// loadOwed makes the owed checks of an earlier process known as final,
// so their work is not run again; payOwed writes them.
func (d *Daemon) loadOwed() {
	for key, o := range d.st.Owed {
		var c forge.Check
		if err := json.Unmarshal(o.Check, &c); err != nil {
			d.log.Error("owed check unreadable; forgotten", "check", key, "err", err)
			delete(d.st.Owed, key)
			continue
		}
		d.rec.Know(key, c)
	}
	if n := len(d.st.Owed); n > 0 {
		d.log.Info("final checks owed by an earlier process are written, not run again", "owed", n)
	}
}

// payOwed writes the owed checks until ctx ends.
func (d *Daemon) payOwed(ctx context.Context) {
	for {
		wait := d.payDue(ctx)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-d.faults.owedWake:
			t.Stop()
		}
	}
}

// payDue tries the owed checks that are due and returns how long to wait
// for the next.
func (d *Daemon) payDue(ctx context.Context) time.Duration {
	type due struct {
		key string
		o   state.Owed
	}
	var todo []due
	wait := time.Hour
	now := time.Now()
	d.mu.Lock()
	for key, o := range d.st.Owed {
		next := d.faults.owedNext[key]
		if next.After(now) {
			wait = min(wait, next.Sub(now))
			continue
		}
		todo = append(todo, due{key, o})
	}
	d.mu.Unlock()
	for _, t := range todo {
		if ctx.Err() != nil {
			return 0
		}
		var c forge.Check
		_ = json.Unmarshal(t.o.Check, &c)
		log := d.log.With("check", t.key)
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		c, err := d.rec.Final(wctx, checks.Finish, t.key, c, log)
		cancel()
		var owed *checks.OwedError
		if err != nil && !errors.As(err, &owed) {
			log.Error("owed check cannot be written; forgotten", "err", err)
			err = nil
		}
		d.mu.Lock()
		if err == nil {
			delete(d.st.Owed, t.key)
			delete(d.faults.owedNext, t.key)
			if t.o.Event != "" {
				if d.st.Done == nil {
					d.st.Done = map[string]time.Time{}
				}
				d.st.Done[t.o.Event] = time.Now().UTC()
			}
		} else {
			o := t.o
			o.Tries++
			o.LastError = err.Error()
			b, _ := json.Marshal(c)
			o.Check = b
			d.st.Owed[t.key] = o
			next := d.nextTry(o.Tries)
			d.faults.owedNext[t.key] = next
			wait = min(wait, time.Until(next))
		}
		snap := d.sf.snapshot(d.st)
		d.mu.Unlock()
		if serr := d.sf.write(snap); serr != nil {
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

// rateLimits remembers, per host, until when the host said it limits
// this client (HTTP 429 or 503 with Retry-After or ratelimit-reset).
type rateLimits struct {
	mu    sync.Mutex
	until map[string]time.Time
	next  http.RoundTripper
}

func (r *rateLimits) client(hc *http.Client) *http.Client {
	c := *hc
	r.next = c.Transport
	if r.next == nil {
		r.next = http.DefaultTransport
	}
	c.Transport = r
	return &c
}

// RoundTrip passes the request on and notes a rate-limit answer.
func (r *rateLimits) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if until, ok := limitedUntil(resp.StatusCode, resp.Header, time.Now()); ok {
		r.mu.Lock()
		r.until[req.URL.Host] = until
		r.mu.Unlock()
	}
	return resp, nil
}

func (r *rateLimits) limitedUntil(hostURL string) time.Time {
	host := strings.TrimPrefix(strings.TrimPrefix(hostURL, "https://"), "http://")
	host = strings.TrimSuffix(host, "/")
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.until[host]
}

// limitedUntil reads when a rate-limited answer says to come back:
// Retry-After (seconds or an HTTP date), else ratelimit-reset (Unix
// seconds, as atproto PDSes send it).
func limitedUntil(status int, h http.Header, now time.Time) (time.Time, bool) {
	if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable && h.Get("ratelimit-remaining") != "0" {
		return time.Time{}, false
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if s, err := strconv.Atoi(v); err == nil && s >= 0 {
			return now.Add(time.Duration(s) * time.Second), true
		}
		if t, err := http.ParseTime(v); err == nil {
			return t, true
		}
	}
	if v := strings.TrimSpace(h.Get("ratelimit-reset")); v != "" {
		if s, err := strconv.ParseInt(v, 10, 64); err == nil && s > 0 {
			return time.Unix(s, 0), true
		}
	}
	return time.Time{}, false
}

// DefaultRetention is how long final work is remembered by default.
const DefaultRetention = 30 * 24 * time.Hour
