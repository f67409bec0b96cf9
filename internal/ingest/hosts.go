package ingest

import (
	"log/slog"
	"time"
)

// hostHealth isolates the owners' PDSes from one another: a host that
// fails is logged and left out of the reconciles for a backoff (its
// repositories are not in the snapshot meanwhile), so one failing PDS
// never stops the work of the others.
type hostHealth struct {
	hosts map[string]*hostState
}

type hostState struct {
	failures int
	next     time.Time
}

// Backoff bounds of a failing host.
const (
	hostBackoff    = 5 * time.Second
	hostBackoffMax = 5 * time.Minute
)

// skip reports whether host is still backing off.
func (h *hostHealth) skip(host string, now time.Time) bool {
	s, ok := h.hosts[host]
	return ok && now.Before(s.next)
}

func (h *hostHealth) failed(host string, err error, now time.Time, log *slog.Logger) {
	if h.hosts == nil {
		h.hosts = map[string]*hostState{}
	}
	s, ok := h.hosts[host]
	if !ok {
		s = &hostState{}
		h.hosts[host] = s
	}
	s.failures++
	wait := hostBackoff
	for i := 1; i < s.failures && wait < hostBackoffMax; i++ {
		wait *= 2
	}
	wait = min(wait, hostBackoffMax)
	s.next = now.Add(wait)
	log.Warn("owner's PDS failed; its repositories are left out until it answers, the others go on", "host", host, "failures", s.failures, "retry_in", wait, "err", err)
}

func (h *hostHealth) ok(host string, log *slog.Logger) {
	if s, found := h.hosts[host]; found {
		log.Info("owner's PDS answers again", "host", host, "after_failures", s.failures)
		delete(h.hosts, host)
	}
}
