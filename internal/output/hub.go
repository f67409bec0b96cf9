package output

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// HubConfig bounds a runner's streams.
type HubConfig struct {
	// Limits bound each stream (RunnerLimits when zero, its readers
	// at most a quarter of MaxSubscribers).
	Limits Limits
	// MaxRuns is how many streams are kept at once, live and ended; an
	// ended one goes first when a new one needs the room (default 64).
	MaxRuns int
	// Retention is how long an ended stream is kept (default an hour).
	Retention time.Duration
	// MaxSubscribers bounds the readers of all streams together
	// (default 4096): each run's own bound (Limits.Subscribers, 1000 by
	// default) is well below it, so one run's readers never take every
	// place. The runner's pusher is not one of them
	// (Stream.WatchReserved).
	MaxSubscribers int
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Hub holds a runner's streams in memory, by check: what its listener
// serves and its pusher sends. Memory is bounded by MaxRuns streams of
// at most Limits.Head+Limits.Tail bytes and their marks each.
type Hub struct {
	cfg   HubConfig
	gate  *gate
	clock *clock

	mu      sync.Mutex
	streams map[string]*Stream
}

// NewHub returns an empty Hub.
func NewHub(cfg HubConfig) *Hub {
	def := cfg.Limits == (Limits{})
	if def {
		cfg.Limits = RunnerLimits()
	}
	if cfg.MaxRuns <= 0 {
		cfg.MaxRuns = 64
	}
	if cfg.Retention <= 0 {
		cfg.Retention = time.Hour
	}
	if cfg.MaxSubscribers <= 0 {
		cfg.MaxSubscribers = 4096
	}
	if def || cfg.Limits.Subscribers <= 0 {
		cfg.Limits.Subscribers = min(RunnerLimits().Subscribers, runShare(cfg.MaxSubscribers))
	}
	custom := cfg.Now != nil // a test's clock: read at every write
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &Hub{cfg: cfg, gate: &gate{max: int64(cfg.MaxSubscribers)}, streams: map[string]*Stream{}}
	if !custom {
		h.clock = &clock{}
	}
	return h
}

// runShare is the default bound on one run's readers out of max
// readers in all: a quarter, so that one run's readers leave room for
// the others'.
func runShare(max int) int { return (max + 3) / 4 }

// Run keeps the hub's coarse clock until ctx ends. While it runs, a
// stream's write reads the wall clock only when a second has passed
// (for its time mark), not at every write: the run's writes cost less.
// A hub whose Run is not running reads the clock at every write.
func (h *Hub) Run(ctx context.Context) {
	if h.clock == nil {
		<-ctx.Done()
		return
	}
	h.clock.sec.Store(time.Now().Unix())
	h.clock.running.Store(true)
	defer h.clock.running.Store(false)
	t := time.NewTicker(ClockTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.clock.sec.Store(now.Unix())
		}
	}
}

// ClockTick is how often Hub.Run's coarse clock is set: a time mark is
// at most this late into its second.
const ClockTick = 50 * time.Millisecond

// Open returns a new, empty stream for check's run; a stream of the
// check kept already (an earlier run) is ended and replaced. Ended
// streams past retention are dropped first, then, when MaxRuns streams
// are kept, the one that ended first; when all are live, Open fails
// with ErrTooManyRuns (the run goes on without live output).
func (h *Hub) Open(check, run string) (*Stream, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep()
	if old, ok := h.streams[check]; ok {
		old.End("")
		delete(h.streams, check)
	}
	if len(h.streams) >= h.cfg.MaxRuns && !h.dropOldestEnded() {
		return nil, fmt.Errorf("open output of %s: %w (%d)", check, ErrTooManyRuns, h.cfg.MaxRuns)
	}
	s := newStream(check, run, h.cfg.Limits, &memSegment{limit: h.cfg.Limits.Head}, &memSegment{limit: h.cfg.Limits.Tail}, h.cfg.Now, h.gate)
	s.clock = h.clock
	h.streams[check] = s
	return s, nil
}

// Stream returns the stream kept for check.
func (h *Hub) Stream(check string) (*Stream, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep()
	s, ok := h.streams[check]
	return s, ok
}

// Len is how many streams are kept.
func (h *Hub) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.streams)
}

// sweep drops ended streams past retention. The caller holds mu.
func (h *Hub) sweep() {
	now := h.cfg.Now()
	for k, s := range h.streams {
		if ended, at := s.endedAt(); ended && now.Sub(at) > h.cfg.Retention {
			delete(h.streams, k)
		}
	}
}

// dropOldestEnded drops the stream that ended first, if one did. The
// caller holds mu.
func (h *Hub) dropOldestEnded() bool {
	type ended struct {
		key string
		at  time.Time
	}
	var es []ended
	for k, s := range h.streams {
		if ok, at := s.endedAt(); ok {
			es = append(es, ended{k, at})
		}
	}
	if len(es) == 0 {
		return false
	}
	sort.Slice(es, func(i, j int) bool { return es[i].at.Before(es[j].at) })
	delete(h.streams, es[0].key)
	return true
}

// endedAt reports whether the stream has ended, and when.
func (s *Stream) endedAt() (bool, time.Time) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.final, s.ended
}
