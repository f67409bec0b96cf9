package outputhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/gorilla/websocket"

	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
)

// A getRunOutput answer, written a piece at a time, is byte for byte
// what encoding/json writes of the stream's read; it carries at most
// MaxFrameMarks marks, its bytes ending before the next.
func TestGetRunOutputAnswerIsTheJSON(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{Limits: output.Limits{Head: 64 << 10, Tail: 64 << 10, Marks: 8192, Subscribers: 5}})
	s, _ := hub.Open(check, "r1")
	for i := range 1100 { // a mark at each of the first 1100 bytes
		s.StepStarted(i+1, fmt.Sprintf("step <%d> & more", i+1))
		_, _ = s.Write([]byte{'a' + byte(i%26)})
	}
	var big bytes.Buffer
	for i := range 20_000 {
		fmt.Fprintf(&big, "line %d\n", i)
	}
	_, _ = s.Write(big.Bytes())
	size := s.Size()
	all, _ := s.Read(0, 1<<20)
	nextMark := all.Marks[outputhttp.MaxFrameMarks].Offset
	srv, _ := serve(t, hub, files{"report.txt": "ok"})

	// want is what the handler wrote before: encoding/json of one read.
	want := func(off int64, limit int) []byte {
		rd, err := s.Read(off, limit)
		if err != nil {
			t.Fatal(err)
		}
		out := output.GetOutput{Check: check, Run: "r1", Offset: rd.Offset, Data: atdata.Bytes(rd.Data), Size: rd.Size,
			Final: rd.Final, Status: rd.Status, Marks: output.ToWire(rd.Marks), Files: []output.File{{Path: "report.txt", Size: 2}}}
		if out.Data == nil {
			out.Data = atdata.Bytes{}
		}
		var b bytes.Buffer
		if err := json.NewEncoder(&b).Encode(out); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	for _, tc := range []struct {
		name               string
		off, limit         int64
		wantOff, wantLimit int64
		end                bool
	}{
		{"a few bytes and their marks", 3, 10, 3, 10, false},
		{"past MaxFrameMarks marks: up to the next", 0, 1 << 20, 0, nextMark, false},
		{"many pieces, to the head's end", 1100, 1 << 20, 1100, 64<<10 - 1100, false},
		{"in the cut: from the tail", 70_000, 1 << 20, size - 64<<10, 64 << 10, false},
		{"none asked", 5, 0, 5, 0, false},
		{"at the end of the ended stream", size, 100, size, 100, true},
	} {
		if tc.end {
			s.End("success")
		}
		resp, err := http.Get(fmt.Sprintf("%s/xrpc/dev.knotless.getRunOutput?check=%s&offset=%d&limit=%d", srv.URL, url.QueryEscape(check), tc.off, tc.limit))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if w := want(tc.wantOff, int(tc.wantLimit)); !bytes.Equal(got, w) {
			i := 0
			for i < min(len(got), len(w)) && got[i] == w[i] {
				i++
			}
			t.Errorf("%s: %d bytes, want %d, first difference at %d: got %.80q, want %.80q", tc.name, len(got), len(w), i, got[i:], w[i:])
		}
	}
}

// tinyBuffers makes the kernel buffer little of an answer, both ways,
// so that a reader that does not read stalls its answer at once.
type tinyBuffers struct{ net.Listener }

func (l tinyBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// serveWith serves h on loopback with tiny socket buffers.
func serveWith(t *testing.T, cfg outputhttp.Config) *httptest.Server {
	t.Helper()
	h, err := outputhttp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = tinyBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// stall asks for query's answer on a new connection that never reads.
func stall(t *testing.T, srv *httptest.Server, query string, header ...string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := "GET /xrpc/" + query + " HTTP/1.1\r\nHost: output.test\r\n" + strings.Join(header, "") + "\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c
}

// bigStream is a hub with a run of a MiB of output.
func bigStream(t *testing.T) *output.Hub {
	t.Helper()
	hub := output.NewHub(output.HubConfig{})
	s, _ := hub.Open(check, "r")
	_, _ = s.Write(bytes.Repeat([]byte(strings.Repeat("x", 1023)+"\n"), 1024))
	return hub
}

var getAll = "dev.knotless.getRunOutput?check=" + url.QueryEscape(check) + "&limit=1048576"

// waitFor calls f until it returns nil, for at most a minute.
func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after a minute", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Readers that never read hold at most MaxAnswers answers, however many
// they are: past it a request is refused at once (Busy), and the room
// comes back when they go.
func TestStalledReadersHoldAtMostMaxAnswers(t *testing.T) {
	t.Parallel()
	srv := serveWith(t, outputhttp.Config{Source: bigStream(t), MaxAnswers: 3, MaxPerClient: 100, WriteTimeout: time.Hour})
	c := &outputhttp.Client{Base: srv.URL}
	var stalled []net.Conn
	for range 3 {
		stalled = append(stalled, stall(t, srv, getAll))
	}
	waitFor(t, "a fourth answer while three readers stall", func() error {
		_, err := c.Get(context.Background(), check, 0, 10)
		if outputhttp.IsError(err, "Busy") {
			return nil
		}
		return fmt.Errorf("answered (%v)", err)
	})
	for _, conn := range stalled {
		conn.Close()
	}
	waitFor(t, "an answer once the stalled readers went", func() error {
		_, err := c.Get(context.Background(), check, 0, 10)
		return err
	})
}

// One address has at most MaxPerClient answers and subscriptions at
// once (TooManyRequests); another address (behind a proxy on the same
// host: X-Forwarded-For) has its own.
func TestOneAddressHoldsAtMostMaxPerClient(t *testing.T) {
	t.Parallel()
	hub := bigStream(t)
	srv := serveWith(t, outputhttp.Config{Source: hub, MaxAnswers: 100, MaxPerClient: 2, WriteTimeout: time.Hour})
	c := &outputhttp.Client{Base: srv.URL}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	following := make(chan struct{})
	subscribed := make(chan error, 1)
	go func() {
		once := sync.OnceFunc(func() { close(following) })
		subscribed <- c.Subscribe(ctx, check, 1<<20, func(ev outputhttp.Event) error {
			once()
			return nil
		})
	}()
	select {
	case <-following:
	case err := <-subscribed:
		t.Fatalf("subscription: %v", err)
	}
	stalled := stall(t, srv, getAll)
	waitFor(t, "a third request from one address", func() error {
		_, err := c.Get(context.Background(), check, 0, 10)
		if outputhttp.IsError(err, "TooManyRequests") {
			return nil
		}
		return fmt.Errorf("answered (%v)", err)
	})
	if err := c.Subscribe(context.Background(), check, 0, func(outputhttp.Event) error { return nil }); !outputhttp.IsError(err, "TooManyRequests") {
		t.Errorf("a third subscription from one address: %v, want TooManyRequests", err)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/xrpc/"+getAll, nil)
	req.Header.Set("X-Forwarded-For", "198.51.100.1, 203.0.113.7")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("another client through a proxy on this host: HTTP %d, want 200", resp.StatusCode)
	}
	stalled.Close()
	cancel()
	<-subscribed
	waitFor(t, "an answer once the address's requests ended", func() error {
		_, err := c.Get(context.Background(), check, 0, 10)
		return err
	})
}

func TestClientAddr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		remote, xff, want string
	}{
		{"203.0.113.7:4242", "", "203.0.113.7"},
		{"203.0.113.7:4242", "198.51.100.1", "203.0.113.7"}, // not a proxy of this host: not believed
		{"127.0.0.1:4242", "", "127.0.0.1"},
		{"127.0.0.1:4242", "198.51.100.1, 203.0.113.9", "203.0.113.9"},
		{"[::1]:4242", "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2::9]:4242", "", "2001:db8:1:2::/64"},
		{"[::ffff:203.0.113.7]:4242", "", "203.0.113.7"},
		{"127.0.0.1:4242", "nonsense", "127.0.0.1"},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got := outputhttp.ClientAddr(r); got != tc.want {
			t.Errorf("%s, X-Forwarded-For %q: %s, want %s", tc.remote, tc.xff, got, tc.want)
		}
	}
}

// logged is a slog handler that tells when a message is logged.
type logged struct {
	msg  string
	seen chan error
}

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logged) WithGroup(string) slog.Handler            { return l }
func (l *logged) Handle(_ context.Context, r slog.Record) error {
	if r.Message == l.msg {
		var err error
		r.Attrs(func(a slog.Attr) bool {
			if e, ok := a.Value.Any().(error); ok {
				err = e
			}
			return true
		})
		select {
		case l.seen <- err:
		default:
		}
	}
	return nil
}

// A reader that stops reading is dropped once a write of its answer
// has waited WriteTimeout: it gets part of the answer and the end of
// the connection, and its place is free again.
func TestStalledReaderIsDropped(t *testing.T) {
	t.Parallel()
	log := &logged{msg: "write run output", seen: make(chan error, 1)}
	srv := serveWith(t, outputhttp.Config{Source: bigStream(t), MaxAnswers: 1, WriteTimeout: 200 * time.Millisecond, Logger: slog.New(log)})
	conn := stall(t, srv, getAll)
	select {
	case err := <-log.seen:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("the stalled answer ended with %v, want a timeout", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the stalled answer was not dropped in a minute")
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
	got, _ := io.ReadAll(conn) // the end of the connection, or its reset
	if len(got) > 1<<20 {
		t.Errorf("the dropped reader got %d bytes, the whole answer", len(got))
	}
	c := &outputhttp.Client{Base: srv.URL}
	waitFor(t, "an answer once the stalled reader was dropped", func() error {
		_, err := c.Get(context.Background(), check, 0, 10)
		return err
	})
}

// A #chunk frame carries at most MaxFrameMarks marks: its bytes end
// before the next, which the next frame carries.
func TestChunkFramesCarryAtMostMaxFrameMarks(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{})
	s, _ := hub.Open(check, "r")
	for i := range 1100 {
		s.StepStarted(i+1, strings.Repeat("n", 300)) // cut to the lexicon's 255 bytes
		_, _ = s.Write([]byte{'x'})
	}
	s.End("success")
	all, _ := s.Read(0, 1<<20)
	_, c := serve(t, hub, nil)
	var data, marks int
	err := c.Subscribe(context.Background(), check, 0, func(ev outputhttp.Event) error {
		if ev.Chunk == nil {
			return nil
		}
		if n := len(ev.Chunk.Marks); n > outputhttp.MaxFrameMarks {
			t.Errorf("a frame with %d marks", n)
		}
		for _, m := range ev.Chunk.Marks {
			if m.Offset < ev.Chunk.Offset || m.Offset >= ev.Chunk.Offset+int64(len(ev.Chunk.Data)) {
				t.Errorf("a mark at %d in a frame of [%d, %d)", m.Offset, ev.Chunk.Offset, ev.Chunk.Offset+int64(len(ev.Chunk.Data)))
			}
			if m.Kind == output.MarkStepStart && len(m.Name) != output.MaxMarkName {
				t.Errorf("a mark's name of %d bytes, want %d", len(m.Name), output.MaxMarkName)
			}
		}
		data += len(ev.Chunk.Data)
		marks += len(ev.Chunk.Marks)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if data != 1100 || marks != len(all.Marks) {
		t.Errorf("%d bytes and %d marks, want 1100 and %d", data, marks, len(all.Marks))
	}
}

// A host is whatever a check's live.service names: a frame larger than
// any of ours ends the subscription before the client reads it.
func TestClientRefusesAHugeFrame(t *testing.T) {
	t.Parallel()
	hostile := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		run, err := outputhttp.EncodeFrame(output.FrameRun, &output.RunFrame{Run: "r"})
		if err != nil || conn.WriteMessage(websocket.BinaryMessage, run) != nil {
			return
		}
		// A #chunk header and more bytes than any frame of ours.
		huge, err := outputhttp.EncodeFrame(output.FrameChunk, &output.Chunk{})
		if err != nil {
			return
		}
		huge = append(huge, make([]byte, outputhttp.MaxFrame)...)
		_ = conn.WriteMessage(websocket.BinaryMessage, huge)
	}))
	defer hostile.Close()
	c := &outputhttp.Client{Base: hostile.URL}
	var frames []string
	err := c.Subscribe(context.Background(), check, 0, func(ev outputhttp.Event) error {
		switch {
		case ev.Run != nil:
			frames = append(frames, "run")
		case ev.Chunk != nil:
			frames = append(frames, fmt.Sprintf("chunk of %d bytes", len(ev.Chunk.Data)))
		}
		return nil
	})
	if !errors.Is(err, websocket.ErrReadLimit) {
		t.Errorf("a frame past MaxFrame: %v, want the read limit", err)
	}
	if strings.Join(frames, "|") != "run" {
		t.Errorf("frames %q, want the #run alone", frames)
	}
}
