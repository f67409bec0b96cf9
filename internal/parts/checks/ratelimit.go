package checks

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RateLimits remembers, per host, until when the host said it limits
// this client (HTTP 429 or 503 with Retry-After or ratelimit-reset):
// the owed checks wait for it. It is an http.RoundTripper wrapping the
// client's transport (Client).
//
// It also remembers what the host said of its record-write budget in
// the ratelimit-* headers of its answers to record writes (the hosted
// PDS: 5,000 points an hour, a create 3, an update 2): Low says when
// little is left, and the checks part then defers its writes that are
// not final.
type RateLimits struct {
	mu     sync.Mutex
	until  map[string]time.Time
	budget map[string]budget
	next   http.RoundTripper
	now    func() time.Time
	// onBudget, when set, is told the points left after each record
	// write (OnBudget).
	onBudget func(remaining int)
}

// budget is what a host last said of its record-write budget.
type budget struct {
	limit, remaining int64
	reset            time.Time
}

// LowBudget is the share of a host's record-write budget under which
// it is low: non-final check writes wait (Keeper).
const LowBudget = 0.1

// NewRateLimits returns an empty memory; Client wraps a client with it.
func NewRateLimits() *RateLimits {
	return &RateLimits{until: map[string]time.Time{}, budget: map[string]budget{}, now: time.Now}
}

// OnBudget has f told the write points a host says are left in its
// window (its ratelimit-remaining header) after each record write
// (putRecord, createRecord, deleteRecord, applyWrites). Call it before
// the client is used.
func (r *RateLimits) OnBudget(f func(remaining int)) { r.onBudget = f }

// recordWrites are the XRPC methods that spend a PDS's write points.
var recordWrites = map[string]bool{
	"/xrpc/com.atproto.repo.putRecord":    true,
	"/xrpc/com.atproto.repo.createRecord": true,
	"/xrpc/com.atproto.repo.deleteRecord": true,
	"/xrpc/com.atproto.repo.applyWrites":  true,
}

// Client returns a copy of hc whose answers are noted.
func (r *RateLimits) Client(hc *http.Client) *http.Client {
	c := *hc
	r.next = c.Transport
	if r.next == nil {
		r.next = http.DefaultTransport
	}
	c.Transport = r
	return &c
}

// RoundTrip passes the request on and notes a rate-limit answer.
func (r *RateLimits) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	now := r.now()
	if until, ok := limitedUntil(resp.StatusCode, resp.Header, now); ok {
		r.mu.Lock()
		r.until[req.URL.Host] = until
		r.mu.Unlock()
	}
	if req.Method == http.MethodPost && recordWrites[req.URL.Path] {
		if b, ok := writeBudget(resp.Header); ok {
			r.mu.Lock()
			r.budget[req.URL.Host] = b
			r.mu.Unlock()
		}
		if n, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("ratelimit-remaining"))); err == nil && n >= 0 && r.onBudget != nil {
			r.onBudget(n)
		}
	}
	return resp, nil
}

// writeBudget reads the budget an answer to a record write states:
// ratelimit-limit, -remaining and -reset (Unix seconds).
func writeBudget(h http.Header) (budget, bool) {
	limit, err1 := strconv.ParseInt(strings.TrimSpace(h.Get("ratelimit-limit")), 10, 64)
	remaining, err2 := strconv.ParseInt(strings.TrimSpace(h.Get("ratelimit-remaining")), 10, 64)
	if err1 != nil || err2 != nil || limit <= 0 {
		return budget{}, false
	}
	b := budget{limit: limit, remaining: remaining}
	if reset, err := strconv.ParseInt(strings.TrimSpace(h.Get("ratelimit-reset")), 10, 64); err == nil && reset > 0 {
		b.reset = time.Unix(reset, 0)
	}
	return b, true
}

// Low reports whether the host of hostURL last said that less than
// LowBudget of its record-write budget is left, in a window that has
// not reset since.
func (r *RateLimits) Low(hostURL string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.budget[hostOf(hostURL)]
	if !ok || (!b.reset.IsZero() && !r.now().Before(b.reset)) {
		return false
	}
	return float64(b.remaining) < LowBudget*float64(b.limit)
}

// Reset is when the host of hostURL said its record-write budget
// refills (zero: it did not).
func (r *RateLimits) Reset(hostURL string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.budget[hostOf(hostURL)].reset
}

func hostOf(hostURL string) string {
	host := strings.TrimPrefix(strings.TrimPrefix(hostURL, "https://"), "http://")
	return strings.TrimSuffix(host, "/")
}

// Until is until when the host of hostURL said it limits this client
// (zero: it did not).
func (r *RateLimits) Until(hostURL string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.until[hostOf(hostURL)]
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
