package output

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/caplog"
	"knotless.dev/run/internal/engine/run"
)

// limitsOf are the limits of a stream that keeps what a caplog.Buffer
// of cap max keeps.
func limitsOf(max int) Limits {
	h, t := caplog.Split(max)
	return Limits{Head: int64(h), Tail: int64(t), Marks: 100, Subscribers: 10}
}

// randomWrites splits a log into writes of random sizes.
func randomWrites(r *rand.Rand, log []byte) [][]byte {
	var ws [][]byte
	for len(log) > 0 {
		n := min(len(log), 1+r.IntN(9))
		ws = append(ws, log[:n])
		log = log[n:]
	}
	return ws
}

// TestStreamKeepsWhatTheLogKeeps: written the same bytes, a stream
// keeps what caplog keeps: its Log is the Buffer's Bytes, and a read at
// any offset gives the log's bytes there, or says they were cut and
// goes on where the kept tail begins.
func TestStreamKeepsWhatTheLogKeeps(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	logs := [][]byte{
		[]byte("short"),
		[]byte(strings.Repeat("line of output\n", 7)),
		[]byte(strings.Repeat("é€😀x", 13)),
	}
	for _, capped := range []int{caplog.MarkerRoom + 10, caplog.MarkerRoom + 33, caplog.MarkerRoom + 200} {
		for _, log := range logs {
			lim := limitsOf(capped)
			s := NewStream("at://did:plc:r/dev.knotless.check/k", "run", lim)
			b := caplog.New(capped)
			for _, w := range randomWrites(r, log) {
				_, _ = s.Write(w)
				_, _ = b.Write(w)
			}
			got, err := s.Log()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(b.Bytes()), string(got)); diff != "" {
				t.Errorf("cap %d: Log (-caplog +stream):\n%s", capped, diff)
			}
			if s.Size() != b.Total() {
				t.Errorf("cap %d: size %d, caplog total %d", capped, s.Size(), b.Total())
			}
			headLen := min(lim.Head, int64(len(log)))
			tailStart := max(headLen, int64(len(log))-lim.Tail)
			for off := int64(0); off < int64(len(log)); off++ {
				rd, err := s.Read(off, 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				wantOff := off
				if off >= headLen && off < tailStart {
					wantOff = tailStart
				}
				if rd.Offset != wantOff || len(rd.Data) == 0 || !bytes.Equal(rd.Data, log[wantOff:wantOff+int64(len(rd.Data))]) {
					t.Fatalf("cap %d, %q: read at %d gave %q at %d, want the log's bytes at %d", capped, log, off, rd.Data, rd.Offset, wantOff)
				}
			}
			if rd, _ := s.Read(int64(len(log)), 10); len(rd.Data) != 0 || rd.Size != int64(len(log)) {
				t.Errorf("read at the end: %q, size %d", rd.Data, rd.Size)
			}
		}
	}
}

// TestStreamSeed: a stream seeded with what an earlier process's log
// kept and its size holds the earlier stream's bytes at the same
// offsets, and written on, keeps what one stream written all along
// keeps.
func TestStreamSeed(t *testing.T) {
	t.Parallel()
	log := []byte(strings.Repeat("0123456789abcdefghij€", 60_000)) // past caplog.DefaultMax
	for _, at := range []int{0, 1000, len(log) / 3, len(log) - 5} {
		whole := NewStream("c", "r", RunnerLimits())
		_, _ = whole.Write(log)
		first := NewStream("c", "r", RunnerLimits())
		_, _ = first.Write(log[:at])
		kept, _ := first.Log()
		next := NewStream("c", "r", RunnerLimits())
		if err := next.Seed(kept, first.Size()); err != nil {
			t.Fatalf("seed at %d: %v", at, err)
		}
		// The earlier stream's bytes are at the same offsets.
		for _, off := range []int64{0, int64(at) / 2, max(0, int64(at)-3)} {
			a, _ := first.Read(off, 100)
			b, _ := next.Read(off, 100)
			if a.Offset != b.Offset || !bytes.Equal(a.Data, b.Data) {
				t.Errorf("seed at %d: read at %d: earlier %q at %d, seeded %q at %d", at, off, a.Data, a.Offset, b.Data, b.Offset)
			}
		}
		_, _ = next.Write(log[at:])
		got, _ := next.Log()
		want, _ := whole.Log()
		if !bytes.Equal(got, want) || next.Size() != whole.Size() {
			t.Errorf("seed at %d: log of %d bytes (size %d), want %d bytes (size %d)", at, len(got), next.Size(), len(want), whole.Size())
		}
	}
	s := NewStream("c", "r", RunnerLimits())
	_, _ = s.Write([]byte("x"))
	if err := s.Seed([]byte("y"), 1); err == nil {
		t.Error("seeded a stream that has bytes")
	}
}

// TestWatcherNeverHoldsTheWriterUp: a watcher that does not read while
// the run writes does not hold the writes up; it gets one signal, and
// reading from its offset it catches up.
func TestWatcherNeverHoldsTheWriterUp(t *testing.T) {
	t.Parallel()
	s := NewStream("c", "r", limitsOf(caplog.MarkerRoom+1000))
	ch, stop, err := s.Watch()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var want bytes.Buffer
	for i := range 10_000 {
		line := fmt.Sprintf("line %d\n", i)
		_, _ = s.Write([]byte(line))
		want.WriteString(line)
	}
	s.End("success")
	<-ch
	select {
	case <-ch:
		t.Error("signals queued up")
	default:
	}
	var got bytes.Buffer
	off := int64(0)
	for {
		rd, err := s.Read(off, 64)
		if err != nil {
			t.Fatal(err)
		}
		if rd.Offset > off {
			fmt.Fprintf(&got, "[cut %d]", rd.Offset-off)
		}
		got.Write(rd.Data)
		off = rd.Offset + int64(len(rd.Data))
		if len(rd.Data) == 0 && rd.Final {
			break
		}
	}
	log, _ := s.Log()
	head, _ := caplog.Split(caplog.MarkerRoom + 1000)
	if !strings.HasPrefix(got.String(), want.String()[:head]) || !strings.HasSuffix(got.String(), want.String()[want.Len()-400:]) {
		t.Errorf("caught up with %d bytes, not the head and tail of the %d written", got.Len(), want.Len())
	}
	if !bytes.Contains(log, []byte("bytes cut from the middle")) {
		t.Error("the log was not cut")
	}
}

func TestWatchBounds(t *testing.T) {
	t.Parallel()
	h := NewHub(HubConfig{Limits: Limits{Head: 10, Tail: 10, Marks: 10, Subscribers: 2}, MaxSubscribers: 3})
	a, _ := h.Open("a", "r")
	b, _ := h.Open("b", "r")
	_, stopA1, err := a.Watch()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Watch(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Watch(); !errors.Is(err, ErrTooManySubscribers) {
		t.Errorf("third watcher of a stream of 2: %v", err)
	}
	if _, _, err := b.Watch(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Watch(); !errors.Is(err, ErrTooManySubscribers) {
		t.Errorf("fourth watcher of a hub of 3: %v", err)
	}
	stopA1()
	stopA1()
	if _, _, err := b.Watch(); err != nil {
		t.Errorf("a watcher after one stopped: %v", err)
	}
}

// The runner's pusher watches with room readers cannot take: with every
// reader's place taken, of the stream and of the hub, a reserved watch
// is still had (up to ReservedWatchers), and it takes no reader's place.
func TestWatchReserved(t *testing.T) {
	t.Parallel()
	h := NewHub(HubConfig{Limits: Limits{Head: 10, Tail: 10, Marks: 10, Subscribers: 1}, MaxSubscribers: 1})
	s, _ := h.Open("a", "r")
	_, stopReader, err := s.Watch()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Watch(); !errors.Is(err, ErrTooManySubscribers) {
		t.Fatalf("a second reader of a stream and a hub of 1: %v", err)
	}
	var stops []func()
	for i := range ReservedWatchers {
		signal, stop, err := s.WatchReserved()
		if err != nil {
			t.Fatalf("reserved watch %d with every reader's place taken: %v", i+1, err)
		}
		stops = append(stops, stop)
		if i == 0 {
			_, _ = s.Write([]byte("x"))
			select {
			case <-signal:
			default:
				t.Error("a reserved watch was not told of a write")
			}
		}
	}
	if _, _, err := s.WatchReserved(); !errors.Is(err, ErrTooManySubscribers) {
		t.Errorf("reserved watch %d: %v", ReservedWatchers+1, err)
	}
	stopReader()
	if _, _, err := s.Watch(); err != nil {
		t.Errorf("a reader once the other stopped, reserved watches going on: %v", err)
	}
	stops[0]()
	stops[0]()
	if _, _, err := s.WatchReserved(); err != nil {
		t.Errorf("a reserved watch once one stopped: %v", err)
	}
}

// By default one run's readers take at most a quarter of the readers'
// places of a hub or a store: the others' runs keep room.
func TestOneRunsReadersLeaveRoom(t *testing.T) {
	t.Parallel()
	h := NewHub(HubConfig{MaxSubscribers: 8})
	st := testStore(t, t.TempDir(), &fakeClock{t: time.Unix(1e9, 0)}, func(c *StoreConfig) {
		c.Limits.Subscribers = 0
		c.MaxSubscribers = 8
	})
	put(t, st, "did:plc:a", PutInput{Check: checkOf("did:plc:a", "k1"), Run: "r"})
	put(t, st, "did:plc:a", PutInput{Check: checkOf("did:plc:a", "k2"), Run: "r"})
	hubA, _ := h.Open("a", "r")
	hubB, _ := h.Open("b", "r")
	storeA, _ := st.Stream(checkOf("did:plc:a", "k1"))
	storeB, _ := st.Stream(checkOf("did:plc:a", "k2"))
	for name, pair := range map[string][2]*Stream{"hub": {hubA, hubB}, "store": {storeA, storeB}} {
		n := 0
		for ; n < 8; n++ {
			if _, _, err := pair[0].Watch(); err != nil {
				break
			}
		}
		if n != 2 {
			t.Errorf("%s of 8 readers: one run took %d, want 2", name, n)
		}
		if _, _, err := pair[1].Watch(); err != nil {
			t.Errorf("%s: another run's reader: %v", name, err)
		}
	}
}

// fakeClock is a clock a test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestMarks(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 100e6, time.UTC)}
	h := NewHub(HubConfig{Limits: Limits{Head: 1000, Tail: 1000, Marks: 4, Subscribers: 1}, Now: clock.Now})
	s, _ := h.Open("c", "r")
	_, _ = s.Write([]byte("a\n"))     // time mark at 0
	_, _ = s.Write([]byte("b\n"))     // same second: none
	s.StepStarted(1, "build")         // at 4
	_, _ = s.Write([]byte("==> 1\n")) // same second
	clock.Add(900 * time.Millisecond) // into the next second
	_, _ = s.Write([]byte("out\n"))   // time mark at 10
	s.StepStarted(1, "build")         // again (adopted): kept once
	s.StepEnded(1, run.Success)       // at 14
	_, _ = s.Write([]byte("<== 1\n")) // same second
	clock.Add(time.Second)            //
	_, _ = s.Write([]byte("late\n"))  // time mark past Marks: dropped
	s.StepStarted(2, "test")          // step marks are kept past Marks
	_, _ = s.Write([]byte("==> 2\n")) //
	rd, _ := s.Read(0, 1000)
	var got []string
	for _, m := range rd.Marks {
		got = append(got, fmt.Sprintf("%d %s %d %s %s %s", m.Offset, m.Kind, m.Step, m.Name, m.Status, m.Time.Format("05.0")))
	}
	want := []string{
		"0 time 0   05.1",
		"4 stepStart 1 build  05.1",
		"10 time 0   06.0",
		"14 stepEnd 1  success 06.0",
		"25 stepStart 2 test  07.0",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("marks (-want +got):\n%s", diff)
	}
	part, _ := s.Read(4, 6)
	if len(part.Marks) != 1 || part.Marks[0].Kind != MarkStepStart {
		t.Errorf("read [4,10): marks %+v, want the step start only", part.Marks)
	}
}

func TestHub(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	h := NewHub(HubConfig{Limits: Limits{Head: 10, Tail: 10, Marks: 10, Subscribers: 10}, MaxRuns: 2, Retention: time.Minute, Now: clock.Now})
	a1, _ := h.Open("a", "1")
	_, _ = a1.Write([]byte("one"))
	a2, err := h.Open("a", "2")
	if err != nil {
		t.Fatal(err)
	}
	if final, _ := a1.Final(); !final {
		t.Error("a stream replaced by a new run's did not end")
	}
	if s, _ := h.Stream("a"); s != a2 {
		t.Error("the check's stream is not the new run's")
	}
	b, _ := h.Open("b", "1")
	if _, err := h.Open("c", "1"); !errors.Is(err, ErrTooManyRuns) {
		t.Errorf("a third live run of 2: %v", err)
	}
	b.End("success")
	clock.Add(time.Second)
	a2.End("failure")
	if _, err := h.Open("c", "1"); err != nil {
		t.Errorf("a run with an ended one to drop: %v", err)
	}
	if _, ok := h.Stream("b"); ok {
		t.Error("the stream that ended first was kept")
	}
	if _, ok := h.Stream("a"); !ok {
		t.Error("the stream that ended last was dropped")
	}
	clock.Add(2 * time.Minute)
	if _, ok := h.Stream("a"); ok {
		t.Error("an ended stream outlived its retention")
	}
	if h.Len() != 1 {
		t.Errorf("%d streams kept, want the live one", h.Len())
	}
}

// While the hub's coarse clock runs, a write reads the wall clock only
// when the clock says a second has passed, and the time marks are as
// before.
func TestCoarseClock(t *testing.T) {
	t.Parallel()
	h := NewHub(HubConfig{})
	s, _ := h.Open("c", "r")
	reads := 0
	at := time.Unix(1000, 300e6)
	s.now = func() time.Time { reads++; return at }
	h.clock.sec.Store(1000)
	h.clock.running.Store(true)
	_, _ = s.Write([]byte("a"))
	_, _ = s.Write([]byte("b"))
	_, _ = s.Write([]byte("c"))
	if reads != 1 {
		t.Errorf("3 writes in one second read the clock %d times, want 1", reads)
	}
	h.clock.sec.Store(1001)
	at = time.Unix(1001, 10e6)
	_, _ = s.Write([]byte("d"))
	_, _ = s.Write([]byte("e"))
	if reads != 2 {
		t.Errorf("2 writes in the next second read the clock %d times in all, want 2", reads)
	}
	h.clock.running.Store(false)
	_, _ = s.Write([]byte("f"))
	if reads != 3 {
		t.Errorf("a write without the coarse clock did not read the wall clock")
	}
	rd, _ := s.Read(0, 10)
	var offs []int64
	for _, m := range rd.Marks {
		offs = append(offs, m.Offset)
	}
	if diff := cmp.Diff([]int64{0, 3}, offs); diff != "" {
		t.Errorf("time marks at (-want +got):\n%s", diff)
	}
}

// Hub.Run keeps the coarse clock and stops with its context.
func TestHubRun(t *testing.T) {
	t.Parallel()
	h := NewHub(HubConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx) }()
	for !h.clock.running.Load() {
		time.Sleep(time.Millisecond)
	}
	if sec := h.clock.sec.Load(); sec < time.Now().Unix()-1 {
		t.Errorf("the clock says %d", sec)
	}
	cancel()
	<-done
	if h.clock.running.Load() {
		t.Error("the clock runs on after Run returned")
	}
}
