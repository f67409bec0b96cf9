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
type RateLimits struct {
	mu     sync.Mutex
	until  map[string]time.Time
	next   http.RoundTripper
	budget func(remaining int)
}

// NewRateLimits returns an empty memory; Client wraps a client with it.
func NewRateLimits() *RateLimits { return &RateLimits{until: map[string]time.Time{}} }

// OnBudget has f told the write points a host says are left in its
// window (its ratelimit-remaining header) after each record write
// (putRecord, createRecord, deleteRecord, applyWrites). Call it before
// the client is used.
func (r *RateLimits) OnBudget(f func(remaining int)) { r.budget = f }

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
	if until, ok := limitedUntil(resp.StatusCode, resp.Header, time.Now()); ok {
		r.mu.Lock()
		r.until[req.URL.Host] = until
		r.mu.Unlock()
	}
	if r.budget != nil && req.Method == http.MethodPost && recordWrites[req.URL.Path] {
		if n, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("ratelimit-remaining"))); err == nil && n >= 0 {
			r.budget(n)
		}
	}
	return resp, nil
}

// Until is until when the host of hostURL said it limits this client
// (zero: it did not).
func (r *RateLimits) Until(hostURL string) time.Time {
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
