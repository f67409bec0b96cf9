package outputhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/events"
	"github.com/gorilla/websocket"

	"knotless.dev/run/internal/engine/caplog"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
)

const check = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.check/zsvmur6bdrvdcvafwfoo7mmwp4"

// files is a FileSource over a map, for the handlers' tests.
type files map[string]string

func (f files) Files(string) []output.File {
	var out []output.File
	for p, b := range f {
		out = append(out, output.File{Path: p, Size: int64(len(b))})
	}
	return out
}

func (f files) OpenFile(_ string, p string) (io.ReadSeekCloser, output.File, error) {
	b, ok := f[p]
	if !ok {
		return nil, output.File{}, output.ErrNotFound
	}
	return nopCloser{strings.NewReader(b)}, output.File{Path: p, Size: int64(len(b))}, nil
}

type nopCloser struct{ io.ReadSeeker }

func (nopCloser) Close() error { return nil }

func serve(t *testing.T, hub *output.Hub, fs outputhttp.FileSource) (*httptest.Server, *outputhttp.Client) {
	t.Helper()
	h, err := outputhttp.New(outputhttp.Config{Source: hub, Files: fs})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, &outputhttp.Client{Base: srv.URL}
}

func catalog(t *testing.T) *pdsclient.Catalog {
	t.Helper()
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

func TestGetRunOutput(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{})
	s, _ := hub.Open(check, "run1")
	s.StepStarted(1, "build")
	_, _ = s.Write([]byte("==> step 1/1: build\nhello\n"))
	srv, c := serve(t, hub, files{"report.txt": "ok"})
	ctx := context.Background()

	out, err := c.Get(ctx, check, 4, 6)
	if err != nil {
		t.Fatal(err)
	}
	if out.Offset != 4 || string(out.Data) != "step 1" || out.Size != 26 || out.Final || out.Run != "run1" || len(out.Files) != 1 {
		t.Errorf("get at 4, 6 bytes: %+v", out)
	}
	out, _ = c.Get(ctx, check, 0, 100)
	if len(out.Marks) != 2 || out.Marks[0].Kind != output.MarkStepStart || *out.Marks[0].Step != 1 || out.Marks[1].Kind != output.MarkTime {
		t.Errorf("marks %+v, want step 1's start and a time mark", out.Marks)
	}
	s.End("success")
	out, _ = c.Get(ctx, check, 26, 100)
	if len(out.Data) != 0 || !out.Final || out.Status != "success" {
		t.Errorf("get at the end of an ended stream: %+v", out)
	}

	// The JSON answers are what the lexicon says.
	for _, q := range []string{"offset=0", "offset=26", "offset=3&limit=0"} {
		resp, err := http.Get(srv.URL + "/xrpc/dev.knotless.getRunOutput?check=" + check + "&" + q)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := catalog(t).ValidateObject("dev.knotless.getRunOutput#output", raw); err != nil {
			t.Errorf("%s: %v\n%s", q, err, raw)
		}
	}

	for _, tc := range []struct {
		query, name string
	}{
		{"check=at://did:plc:x/dev.knotless.check/nope", "RunNotFound"},
		{"check=nonsense", "InvalidRequest"},
		{"check=at://did:plc:x/dev.knotless.pull/k", "InvalidRequest"},
		{"check=" + check + "&offset=-1", "InvalidRequest"},
		{"check=" + check + "&limit=2000000", "InvalidRequest"},
	} {
		resp, err := http.Get(srv.URL + "/xrpc/dev.knotless.getRunOutput?" + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if body.Error != tc.name {
			t.Errorf("%s: error %q (HTTP %d), want %s", tc.query, body.Error, resp.StatusCode, tc.name)
		}
	}
}

// collect follows a subscription to its end and returns the bytes, with
// gaps as "[cut N]", and the frames' raw bodies.
func collect(t *testing.T, c *outputhttp.Client, cursor int64) (string, []outputhttp.Event) {
	t.Helper()
	var b strings.Builder
	var evs []outputhttp.Event
	err := c.Subscribe(context.Background(), check, cursor, func(ev outputhttp.Event) error {
		evs = append(evs, ev)
		switch {
		case ev.Chunk != nil:
			b.Write(ev.Chunk.Data)
		case ev.Gap != nil:
			fmt.Fprintf(&b, "[cut %d]", ev.Gap.Next-ev.Gap.Offset)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String(), evs
}

// A subscriber that joins while the run writes gets every byte once, in
// order, then the end; one that comes back with the offset it reached
// gets the rest and nothing twice.
func TestSubscribe(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{})
	s, _ := hub.Open(check, "r")
	_, c := serve(t, hub, nil)
	var want strings.Builder
	first := "first line\n"
	_, _ = s.Write([]byte(first))
	want.WriteString(first)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 2000 {
			line := fmt.Sprintf("line %d of the run\n", i)
			_, _ = s.Write([]byte(line))
		}
		s.End("failure")
	}()
	for i := range 2000 {
		want.WriteString(fmt.Sprintf("line %d of the run\n", i))
	}
	got, evs := collect(t, c, 0)
	wg.Wait()
	if got != want.String() {
		t.Fatalf("subscriber got %d bytes, want the %d written", len(got), want.Len())
	}
	last := evs[len(evs)-1]
	if last.End == nil || last.End.Status != "failure" || last.End.Size != int64(want.Len()) {
		t.Errorf("last frame %+v, want the end", last)
	}
	off := int64(12345)
	rest, _ := collect(t, c, off)
	if rest != want.String()[off:] {
		t.Errorf("resumed at %d: %d bytes, want %d", off, len(rest), want.Len()-int(off))
	}
}

// Bytes the stream did not keep come as a #gap, and the frames decode
// with indigo's event-stream types and validate against the lexicon.
func TestSubscribeFrames(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{Limits: output.Limits{Head: 10, Tail: 10, Marks: 10, Subscribers: 5}})
	s, _ := hub.Open(check, "r")
	srv, c := serve(t, hub, nil)
	s.StepStarted(1, "build")
	_, _ = s.Write([]byte("0123456789abcdefghijklmnopqrstuvwxyz"))
	s.End("success")
	got, _ := collect(t, c, 0)
	if got != "0123456789[cut 16]qrstuvwxyz" {
		t.Errorf("got %q", got)
	}

	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+"/xrpc/dev.knotless.subscribeRunOutput?check="+check, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cat := catalog(t)
	for _, want := range []string{"#run", "#chunk", "#gap", "#chunk", "#end"} {
		_, b, err := conn.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		r := bytes.NewReader(b)
		var h events.EventHeader // indigo's own
		if err := h.UnmarshalCBOR(r); err != nil || h.Op != events.EvtKindMessage || h.MsgType != want {
			t.Fatalf("header %+v (%v), want op 1 and %s", h, err, want)
		}
		body, _ := io.ReadAll(r)
		data, err := atdata.UnmarshalCBOR(body)
		if err != nil {
			t.Fatalf("%s body is not DAG-CBOR: %v", want, err)
		}
		raw, _ := json.Marshal(data)
		if err := cat.ValidateObject("dev.knotless.subscribeRunOutput"+want, raw); err != nil {
			t.Errorf("%s: %v (%s)", want, err, raw)
		}
	}

	// An error frame: op -1 and indigo's ErrorFrame.
	conn2, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+"/xrpc/dev.knotless.subscribeRunOutput?check="+check+"&cursor=99", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	_, b, err := conn2.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	r := bytes.NewReader(b)
	var h events.EventHeader
	var ef events.ErrorFrame
	if h.UnmarshalCBOR(r) != nil || ef.UnmarshalCBOR(r) != nil || h.Op != events.EvtKindErrorFrame || ef.Error != "FutureCursor" {
		t.Errorf("cursor past the end: header %+v, error %+v", h, ef)
	}
}

// A stream a new run of the check replaces (its runner lost the run and
// runs the work again) goes on, on the same connection, with the new
// run's #run and its bytes from offset 0; a subscriber that comes back
// naming the run it followed gets the new run from its start, whatever
// its cursor.
func TestSubscribeReplaced(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{})
	old, _ := hub.Open(check, "r1")
	_, c := serve(t, hub, nil)
	_, _ = old.Write([]byte("first attempt\n"))
	var frames []string
	firstLine := make(chan struct{})
	seen := sync.OnceFunc(func() { close(firstLine) })
	errc := make(chan error, 1)
	go func() {
		errc <- c.Subscribe(context.Background(), check, 0, func(ev outputhttp.Event) error {
			switch {
			case ev.Run != nil:
				frames = append(frames, "run "+ev.Run.Run)
			case ev.Chunk != nil:
				frames = append(frames, fmt.Sprintf("%d %q", ev.Chunk.Offset, ev.Chunk.Data))
				seen()
			case ev.End != nil:
				frames = append(frames, "end "+ev.End.Status)
			}
			return nil
		})
	}()
	<-firstLine
	again, _ := hub.Open(check, "r2")
	_, _ = again.Write([]byte("second attempt\n"))
	again.End("success")
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	want := []string{"run r1", `0 "first attempt\n"`, "run r2", `0 "second attempt\n"`, "end success"}
	if strings.Join(frames, "|") != strings.Join(want, "|") {
		t.Errorf("frames %q, want %q", frames, want)
	}

	frames = nil
	if err := c.Resume(context.Background(), check, "r1", 14, func(ev outputhttp.Event) error {
		switch {
		case ev.Run != nil:
			frames = append(frames, "run "+ev.Run.Run)
		case ev.Chunk != nil:
			frames = append(frames, fmt.Sprintf("%d %q", ev.Chunk.Offset, ev.Chunk.Data))
		case ev.End != nil:
			frames = append(frames, "end "+ev.End.Status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want = []string{"run r2", `0 "second attempt\n"`, "end success"}
	if strings.Join(frames, "|") != strings.Join(want, "|") {
		t.Errorf("resumed naming the replaced run: frames %q, want %q", frames, want)
	}
}

func TestSubscribeErrors(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{Limits: output.Limits{Head: 10, Tail: 10, Marks: 10, Subscribers: 1}})
	s, _ := hub.Open(check, "r")
	_, c := serve(t, hub, nil)
	_, stop, err := s.Watch()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, tc := range []struct {
		check string
		want  string
	}{
		{check, "TooManySubscribers"},
		{"at://did:plc:x/dev.knotless.check/nope", "RunNotFound"},
		{"nonsense", "InvalidRequest"},
	} {
		err := c.Subscribe(context.Background(), tc.check, 0, func(outputhttp.Event) error { return nil })
		if !outputhttp.IsError(err, tc.want) {
			t.Errorf("%s: %v, want %s", tc.check, err, tc.want)
		}
	}
}

// A subscriber that stops reading never holds the run's writes up: the
// writes all return while its connection is full, and another
// subscriber reads everything kept.
func TestSlowSubscriberDoesNotHoldTheRunUp(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{})
	s, _ := hub.Open(check, "r")
	srv, c := serve(t, hub, nil)
	slow, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+"/xrpc/dev.knotless.subscribeRunOutput?check="+check, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close() // never read
	for s.Watchers() != 1 {
		time.Sleep(time.Millisecond) // the server registers the watcher after the handshake
	}
	line := []byte(strings.Repeat("z", 1023) + "\n")
	for range 20_000 { // 20 MB: far more than the socket buffers hold
		_, _ = s.Write(line)
	}
	s.End("success")
	got, _ := collect(t, c, 0)
	head, tail := caplog.Split(caplog.DefaultMax)
	if want := head + tail; len(got) < want || !strings.Contains(got, "[cut ") {
		t.Errorf("fast subscriber got %d bytes, want the %d kept and a cut", len(got), want)
	}
}

func TestGetRunFile(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{})
	_, _ = hub.Open(check, "r")
	srv, _ := serve(t, hub, files{"dir/page.html": "<script>alert(1)</script>"})
	resp, err := http.Get(srv.URL + "/xrpc/dev.knotless.getRunFile?check=" + check + "&path=dir/page.html")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "<script>alert(1)</script>" || resp.Header.Get("Content-Type") != "application/octet-stream" ||
		!strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment") || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("file served as %v: %q", resp.Header, body)
	}
	resp, _ = http.Get(srv.URL + "/xrpc/dev.knotless.getRunFile?check=" + check + "&path=nope")
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("a file not kept: HTTP %d", resp.StatusCode)
	}
}

// The page is served with a policy that lets its own inline script and
// style run and nothing else, and only for a DID and a record key.
func TestPage(t *testing.T) {
	t.Parallel()
	srv, _ := serve(t, output.NewHub(output.HubConfig{}), nil)
	resp, err := http.Get(srv.URL + "/runs/did:plc:ewvi7nxzyoun6zhxrhs64oiz/zsvmur6bdrvdcvafwfoo7mmwp4")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != 200 || !strings.Contains(string(body), "subscribeRunOutput") || !strings.Contains(csp, "script-src 'sha256-") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("page: HTTP %d, CSP %q", resp.StatusCode, csp)
	}
	if regexp.MustCompile(`(?i)(src|href)="(https?:)?//`).Match(body) {
		t.Error("the page loads something from elsewhere")
	}
	for _, p := range []string{"/runs/notadid/k", "/runs/did:plc:x/..", "/runs/did:plc:x"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: HTTP %d, want 404", p, resp.StatusCode)
		}
	}
}

// A cursor past the end of a stream that goes on waits for the stream
// to reach it: a run taken up after its runner died goes on from a
// checkpoint behind where its readers were, and its readers coming back
// get the bytes from their cursor, once. A stream that ends short of
// the cursor refuses it (FutureCursor), as one that had ended already.
func TestSubscribeAheadOfATakenUpRun(t *testing.T) {
	t.Parallel()
	hub := output.NewHub(output.HubConfig{})
	s, _ := hub.Open(check, "r")
	_, c := serve(t, hub, nil)
	full := "knotless-run: header\n==> step 1/1: s\ntick 1\ntick 2\ntick 3\n"
	_, _ = s.Write([]byte(full[:21])) // the checkpoint's log
	cursor := int64(len(full) - len("tick 3\n"))
	got := make(chan outputhttp.Event, 16)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- c.Resume(ctx, check, "r", cursor, func(ev outputhttp.Event) error {
			got <- ev
			return nil
		})
	}()
	var first outputhttp.Event
	select {
	case first = <-got:
	case err := <-done:
		t.Fatalf("the subscription ahead of the stream ended: %v", err)
	}
	if first.Run == nil || first.Run.Run != "r" {
		t.Fatalf("first frame %+v, want #run r", first)
	}
	_, _ = s.Write([]byte(full[21:])) // the step read again from its first byte
	ev := <-got
	if ev.Chunk == nil || ev.Chunk.Offset != cursor || string(ev.Chunk.Data) != "tick 3\n" {
		t.Fatalf("frame %+v, want the chunk at the cursor %d, tick 3", ev, cursor)
	}
	s.End("success")
	if ev := <-got; ev.End == nil {
		t.Errorf("frame %+v, want #end", ev)
	}
	<-done

	// A stream that ended short of the cursor.
	short, _ := hub.Open("at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.check/short", "r")
	_, _ = short.Write([]byte("abc"))
	ended := make(chan error, 1)
	go func() {
		ended <- c.Resume(context.Background(), "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.check/short", "r", 10, func(outputhttp.Event) error { return nil })
	}()
	time.Sleep(50 * time.Millisecond) // the subscriber waits at its cursor
	short.End("success")
	if err := <-ended; !outputhttp.IsError(err, "FutureCursor") {
		t.Errorf("a stream that ended short of the cursor: %v, want FutureCursor", err)
	}
}
