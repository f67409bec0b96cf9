package outputhttp

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
)

// limiter bounds what readers hold at once: the answers being written
// (getRunOutput, getRunFile), all clients together, and what each
// client address has (answers and subscriptions). Subscriptions in all
// are bounded by the source's watchers (output.Hub, output.Store).
type limiter struct {
	maxAnswers, perClient int

	mu      sync.Mutex
	answers int
	clients map[string]int
}

func newLimiter(maxAnswers, perClient int) *limiter {
	return &limiter{maxAnswers: maxAnswers, perClient: perClient, clients: map[string]int{}}
}

// refusal is a request refused by a bound, with its XRPC error.
type refusal struct {
	status        int
	name, message string
}

// take takes a place for one request of client, an answer or a
// subscription, and returns the function that gives it back; past a
// bound, the refusal.
func (l *limiter) take(client string, answer bool) (func(), *refusal) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clients[client] >= l.perClient {
		return nil, &refusal{http.StatusTooManyRequests, "TooManyRequests",
			fmt.Sprintf("%s has %d requests and subscriptions going already; try again when one has ended", client, l.perClient)}
	}
	if answer && l.answers >= l.maxAnswers {
		return nil, &refusal{http.StatusServiceUnavailable, "Busy",
			fmt.Sprintf("%d answers are being written already; try again shortly", l.maxAnswers)}
	}
	l.clients[client]++
	if answer {
		l.answers++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.clients[client]--; l.clients[client] <= 0 {
				delete(l.clients, client)
			}
			if answer {
				l.answers--
			}
		})
	}, nil
}

// admit takes a place for r (an answer, or a subscription) or answers
// the refusal: at once, never queued.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, answer bool) (func(), bool) {
	release, no := h.lim.take(h.cfg.ClientAddr(r), answer)
	if no != nil {
		w.Header().Set("Retry-After", "1")
		XRPCError(w, no.status, no.name, no.message)
		return nil, false
	}
	return release, true
}

// ClientAddr is the address a request's client is counted by: the IP
// address of its connection's peer, an IPv6 one by its /64 (what one
// host is given). A peer on the loopback address is a proxy on the same
// host (a TLS proxy in front of the listener): its client is the
// X-Forwarded-For address the proxy appended (the last one).
func ClientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.IsLoopback() {
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			last := xff[len(xff)-1]
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			if fwd, err := netip.ParseAddr(strings.TrimSpace(last)); err == nil {
				ip = fwd.Unmap()
			}
		}
	}
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.String()
		}
	}
	return ip.String()
}
