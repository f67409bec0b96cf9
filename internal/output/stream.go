package output

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"knotless.dev/run/internal/engine/caplog"
	"knotless.dev/run/internal/engine/run"
)

// Stream is one run's output. Bytes are appended at its size, never
// changed, and read from any offset: the first Limits.Head bytes and the
// last Limits.Tail bytes are kept (as caplog keeps a log), a byte between
// them reads as cut. Writing never waits for a reader: a watcher is told
// that something changed by a channel that holds one signal, and reads
// from the offset it has reached.
type Stream struct {
	check, run string
	lim        Limits
	now        func() time.Time
	gate       *gate  // the bound on watchers of all streams; nil: none
	clock      *clock // its hub's coarse clock; nil: none

	mu        sync.RWMutex
	head      segment
	ring      segment
	headLen   int64 // bytes [0, headLen) are in head
	tailStart int64 // bytes [tailStart, size) are in ring, at offset % Tail
	size      int64
	marks     []Mark
	started   map[int]bool // steps with a start mark
	lastTime  int64        // Unix second of the last time mark
	final     bool
	status    string
	updated   time.Time
	ended     time.Time
	watchers  map[chan struct{}]struct{}
	reserved  int // of watchers, those of WatchReserved
}

var _ run.StepMarker = (*Stream)(nil)

// NewStream returns an empty stream of check's run, kept in memory.
func NewStream(check, run string, lim Limits) *Stream {
	return newStream(check, run, lim, &memSegment{limit: lim.Head}, &memSegment{limit: lim.Tail}, time.Now, nil)
}

func newStream(check, run string, lim Limits, head, ring segment, now func() time.Time, g *gate) *Stream {
	return &Stream{
		check: check, run: run, lim: lim, now: now, gate: g,
		head: head, ring: ring,
		started:  map[int]bool{},
		updated:  now(),
		watchers: map[chan struct{}]struct{}{},
	}
}

// Check is the check record's AT-URI the stream is the output of.
func (s *Stream) Check() string { return s.check }

// Run is the run the stream is the output of.
func (s *Stream) Run() string { return s.run }

// Write appends p, with a time mark when the wall clock has passed into
// a new second since the last one. It never fails and never waits for a
// reader: it is the engine's Request.Live. Bytes written after End are
// dropped.
func (s *Stream) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final {
		return len(p), nil
	}
	// The wall clock is read when a second may have passed: at every
	// write, or, while the hub's coarse clock runs, when it says so.
	if c := s.clock; c == nil || !c.running.Load() || c.sec.Load() != s.lastTime {
		now := s.now()
		s.updated = now
		if sec := now.Unix(); sec != s.lastTime {
			s.lastTime = sec
			s.addMark(Mark{Offset: s.size, Time: now, Kind: MarkTime})
		}
	}
	// Only a file segment fails, and the engine does not write to one:
	// a run never fails for its live output.
	_ = s.append(p)
	s.notifyLocked()
	return len(p), nil
}

// clock is a hub's coarse clock: the current Unix second, kept by
// Hub.Run, so that a write need not read the wall clock to know that no
// second has passed.
type clock struct {
	running atomic.Bool
	sec     atomic.Int64
}

// StepStarted marks where step's header line begins (run.StepMarker).
// A step marked started already (a run adopted during the step) keeps
// its first mark.
func (s *Stream) StepStarted(step int, name string) {
	s.mu.Lock()
	if !s.final && !s.started[step] {
		s.started[step] = true
		s.addMark(Mark{Offset: s.size, Time: s.now(), Kind: MarkStepStart, Step: step, Name: name})
	}
	s.mu.Unlock()
}

// StepEnded marks where step's footer line begins (run.StepMarker).
func (s *Stream) StepEnded(step int, status run.Status) {
	s.mu.Lock()
	if !s.final {
		s.addMark(Mark{Offset: s.size, Time: s.now(), Kind: MarkStepEnd, Step: step, Status: string(status)})
	}
	s.mu.Unlock()
}

// addMark keeps m within the bounds, in offset order. The caller holds
// mu.
func (s *Stream) addMark(m Mark) {
	if n := len(s.marks); n > 0 && s.marks[n-1].Offset > m.Offset {
		return
	}
	switch {
	case m.Kind == MarkTime && len(s.marks) >= s.lim.Marks:
		return
	case len(s.marks) >= s.lim.Marks+StepMarks:
		return
	}
	s.marks = append(s.marks, m)
}

// append puts p at the end. The caller holds mu.
func (s *Stream) append(p []byte) error {
	if s.headLen == s.size && s.headLen < s.lim.Head {
		k := min(s.lim.Head-s.headLen, int64(len(p)))
		if err := s.head.WriteAt(p[:k], s.headLen); err != nil {
			s.skip(s.size + int64(len(p)))
			return fmt.Errorf("keep output: %w", err)
		}
		s.headLen += k
		s.size += k
		s.tailStart = s.size
		p = p[k:]
	}
	if len(p) == 0 {
		return nil
	}
	if s.lim.Tail <= 0 {
		s.skip(s.size + int64(len(p)))
		return nil
	}
	if n := int64(len(p)); n > s.lim.Tail {
		// Only the last Tail bytes are kept.
		s.skip(s.size + n - s.lim.Tail)
		p = p[n-s.lim.Tail:]
	}
	off := s.size
	for len(p) > 0 {
		pos := off % s.lim.Tail
		n := min(int64(len(p)), s.lim.Tail-pos)
		if err := s.ring.WriteAt(p[:n], pos); err != nil {
			s.skip(off + int64(len(p)))
			return fmt.Errorf("keep output: %w", err)
		}
		p = p[n:]
		off += n
	}
	s.size = off
	s.tailStart = max(s.tailStart, s.size-s.lim.Tail)
	return nil
}

// skip moves the end to, the bytes up to it cut. The caller holds mu.
func (s *Stream) skip(to int64) {
	if to > s.size {
		s.size = to
		s.tailStart = to
	}
}

// Seed starts an empty stream with the log of an earlier process of the
// run (a handover): kept is the log it kept (run.Result.Log) and size
// how many bytes it had (run.Handover.LogSize). The stream then holds
// what the earlier process's stream held, at the same offsets, and goes
// on at size. A log that was cut in the middle seeds its head and tail
// around the cut.
func (s *Stream) Seed(kept []byte, size int64) error {
	if size < int64(len(kept)) {
		size = int64(len(kept))
	}
	var head, tail []byte
	if size == int64(len(kept)) {
		head = kept
	} else {
		var err error
		if head, tail, err = caplog.Parse(caplog.DefaultMax, kept, size); err != nil {
			return fmt.Errorf("seed the output stream: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.notifyLocked()
	if s.size != 0 {
		return fmt.Errorf("seed the output stream: it has %d bytes already", s.size)
	}
	if err := s.append(head); err != nil {
		return err
	}
	s.skip(size - int64(len(tail)))
	return s.append(tail)
}

// End ends the stream with the run's status: readers read to its size
// and stop. Later writes and marks are dropped.
func (s *Stream) End(status string) {
	s.mu.Lock()
	if !s.final {
		s.final, s.status, s.ended = true, status, s.now()
	}
	s.notifyLocked()
	s.mu.Unlock()
}

// Read is what a reader gets from a stream.
type Read struct {
	// Offset is where Data begins: the offset asked for, or past it when
	// the bytes there were cut.
	Offset int64
	Data   []byte
	// Marks are the marks whose offsets fall in Data.
	Marks []Mark
	// Size is the stream's size; Final says it has ended, with Status.
	Size   int64
	Final  bool
	Status string
}

// Read returns at most limit bytes from off. Data is empty when off is
// the end (or past it).
func (s *Stream) Read(off int64, limit int) (Read, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := Read{Offset: off, Size: s.size, Final: s.final, Status: s.status}
	if off < 0 || off >= s.size || limit <= 0 {
		return r, nil
	}
	var err error
	if off < s.headLen {
		r.Data = make([]byte, min(int64(limit), s.headLen-off))
		err = s.head.ReadAt(r.Data, off)
	} else {
		off = max(off, s.tailStart)
		r.Offset = off
		if off < s.size {
			r.Data = make([]byte, min(int64(limit), s.size-off))
			err = s.readRing(r.Data, off)
		}
	}
	if err != nil {
		return Read{Offset: r.Offset, Size: s.size, Final: s.final, Status: s.status}, fmt.Errorf("read output of %s at %d: %w", s.check, off, err)
	}
	r.Marks = s.marksIn(r.Offset, r.Offset+int64(len(r.Data)))
	return r, nil
}

// readRing reads p from the ring at stream offset off. The caller holds
// mu.
func (s *Stream) readRing(p []byte, off int64) error {
	for len(p) > 0 {
		pos := off % s.lim.Tail
		n := min(int64(len(p)), s.lim.Tail-pos)
		if err := s.ring.ReadAt(p[:n], pos); err != nil {
			return err
		}
		p = p[n:]
		off += n
	}
	return nil
}

// marksIn returns a copy of the marks in [from, to). The caller holds
// mu.
func (s *Stream) marksIn(from, to int64) []Mark {
	i := sort.Search(len(s.marks), func(i int) bool { return s.marks[i].Offset >= from })
	j := sort.Search(len(s.marks), func(i int) bool { return s.marks[i].Offset >= to })
	if i >= j {
		return nil
	}
	return append([]Mark(nil), s.marks[i:j]...)
}

// Marks returns at most max of the marks in [from, to), less the first
// skip of them, in offset order: a reader that wrote the bytes of
// [from, to) already reads their marks in small batches (the marks
// below the stream's size never change).
func (s *Stream) Marks(from, to int64, skip, max int) []Mark {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i := sort.Search(len(s.marks), func(i int) bool { return s.marks[i].Offset >= from })
	j := sort.Search(len(s.marks), func(i int) bool { return s.marks[i].Offset >= to })
	i += skip
	j = min(j, i+max)
	if i >= j {
		return nil
	}
	return append([]Mark(nil), s.marks[i:j]...)
}

// Log is the log blob a run whose output this is would have: the kept
// head and tail joined as caplog joins them. With RunnerLimits it is
// run.Result.Log byte for byte.
func (s *Stream) Log() ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	head := make([]byte, s.headLen)
	if err := s.head.ReadAt(head, 0); err != nil {
		return nil, err
	}
	tail := make([]byte, s.size-s.tailStart)
	if err := s.readRing(tail, s.tailStart); err != nil {
		return nil, err
	}
	return caplog.Join(head, tail, s.size), nil
}

// Size is how many bytes were written.
func (s *Stream) Size() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.size
}

// Final reports whether the stream has ended, and with which status.
func (s *Stream) Final() (bool, string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.final, s.status
}

// Watch returns a channel that receives a signal when the stream
// changes (bytes, marks, its end) after the call, and the function that
// stops the watch. Signals do not queue up: one waits while the watcher
// is busy, and it reads from its offset all that came meanwhile. It
// fails past the stream's bound on watchers (Limits.Subscribers), or
// its hub's or store's on all streams together.
func (s *Stream) Watch() (<-chan struct{}, func(), error) {
	if !s.gate.acquire() {
		return nil, nil, fmt.Errorf("%w: at most %d readers in all", ErrTooManySubscribers, s.gate.max)
	}
	ch, stop, err := s.watch(false)
	if err != nil {
		s.gate.release()
		return nil, nil, err
	}
	return ch, func() {
		if stop() {
			s.gate.release()
		}
	}, nil
}

// ReservedWatchers is how many reserved watches (WatchReserved) a
// stream takes at once.
const ReservedWatchers = 4

// WatchReserved is Watch for the runner's own pusher: it takes none of
// the room kept for readers (Limits.Subscribers, the hub's or store's
// bound), so that readers, however many, never stop a run's push to an
// output service. A stream takes at most ReservedWatchers of them.
func (s *Stream) WatchReserved() (<-chan struct{}, func(), error) {
	ch, stop, err := s.watch(true)
	if err != nil {
		return nil, nil, err
	}
	return ch, func() { stop() }, nil
}

// watch adds a watcher, a reserved one or a reader's, within the
// stream's own bound; its stop reports whether it stopped the watch
// (the first call).
func (s *Stream) watch(reserved bool) (<-chan struct{}, func() bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case reserved && s.reserved >= ReservedWatchers:
		return nil, nil, fmt.Errorf("%w: at most %d reserved watches of %s", ErrTooManySubscribers, ReservedWatchers, s.check)
	case !reserved && len(s.watchers)-s.reserved >= s.lim.Subscribers:
		return nil, nil, fmt.Errorf("%w: at most %d readers of %s", ErrTooManySubscribers, s.lim.Subscribers, s.check)
	}
	ch := make(chan struct{}, 1)
	s.watchers[ch] = struct{}{}
	if reserved {
		s.reserved++
	}
	var once sync.Once
	return ch, func() bool {
		stopped := false
		once.Do(func() {
			s.mu.Lock()
			delete(s.watchers, ch)
			if reserved {
				s.reserved--
			}
			s.mu.Unlock()
			stopped = true
		})
		return stopped
	}, nil
}

// Watchers is how many watch the stream.
func (s *Stream) Watchers() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.watchers)
}

// notifyLocked signals every watcher without waiting for any. The
// caller holds mu.
func (s *Stream) notifyLocked() {
	for ch := range s.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// gate bounds the watchers of many streams together.
type gate struct {
	n   atomic.Int64
	max int64
}

func (g *gate) acquire() bool {
	if g == nil {
		return true
	}
	if g.n.Add(1) > g.max {
		g.n.Add(-1)
		return false
	}
	return true
}

func (g *gate) release() {
	if g != nil {
		g.n.Add(-1)
	}
}
