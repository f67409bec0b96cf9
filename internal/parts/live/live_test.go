package live_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/output/outputservice/servicetest"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/rules/job"
)

const (
	serviceDID = "did:web:output.test"
	runner     = syntax.DID("did:plc:ewvi7nxzyoun6zhxrhs64oiz")
	key        = "zsvmur6bdrvdcvafwfoo7mmwp4"
	check      = "at://" + string(runner) + "/dev.knotless.check/" + key
)

// service runs the real output service for the runner (servicetest);
// the real PDS's tokens are the output service's and the daemon's tests'.
func service(t testing.TB) (string, *servicetest.Tokens) {
	t.Helper()
	return servicetest.Start(t, servicetest.Config{ServiceDID: serviceDID, Runner: runner,
		Store: output.StoreConfig{Limits: output.Limits{Head: 1 << 20, Tail: 1 << 20}, MaxRunsPerRunner: 4, MaxFiles: 10, MaxFileBytes: 1 << 20, Retention: time.Hour}})
}

// start is the live part of a runner process, started and serving until
// the returned stop (the daemon's stop after its handover).
func start(t *testing.T, cfg live.Config, tokens *servicetest.Tokens) (*live.Live, func()) {
	t.Helper()
	l := live.New(cfg, runner, filepath.Join(t.TempDir(), "files"), live.Ports{Tokens: tokens}, nil)
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	stop := l.Serve()
	t.Cleanup(stop)
	return l, stop
}

// follower follows the check's output on one connection, recording its
// frames, and tells when a line has shown.
type follower struct {
	mu     sync.Mutex
	frames []string
	data   strings.Builder
	wait   map[string]chan struct{}
	done   chan error
}

func follow(c *outputhttp.Client, lines ...string) *follower {
	f := &follower{wait: map[string]chan struct{}{}, done: make(chan error, 1)}
	for _, l := range lines {
		f.wait[l] = make(chan struct{})
	}
	go func() {
		for {
			err := f.subscribe(c)
			if !outputhttp.IsError(err, "RunNotFound") {
				f.done <- err
				return
			}
			// Not pushed yet: the host knows the run from its first put.
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return f
}

func (f *follower) subscribe(c *outputhttp.Client) error {
	return c.Subscribe(context.Background(), check, 0, func(ev outputhttp.Event) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch {
		case ev.Run != nil:
			f.frames = append(f.frames, "run "+ev.Run.Run)
		case ev.Chunk != nil:
			f.frames = append(f.frames, fmt.Sprintf("%d %q", ev.Chunk.Offset, ev.Chunk.Data))
			f.data.Write(ev.Chunk.Data)
		case ev.Gap != nil:
			f.frames = append(f.frames, fmt.Sprintf("gap %d %d", ev.Gap.Offset, ev.Gap.Next))
		case ev.End != nil:
			f.frames = append(f.frames, "end "+ev.End.Status)
		}
		for l, ch := range f.wait {
			if strings.Contains(f.data.String(), l) {
				close(ch)
				delete(f.wait, l)
			}
		}
		return nil
	})
}

// seen waits until line has come.
func (f *follower) seen(t *testing.T, line string) {
	t.Helper()
	f.mu.Lock()
	ch, ok := f.wait[line]
	f.mu.Unlock()
	if !ok {
		return
	}
	select {
	case <-ch:
	case err := <-f.done:
		t.Fatalf("the subscription ended before %q showed: %v", line, err)
	}
}

// end waits for the subscription's end and returns the bytes and frames.
func (f *follower) end(t *testing.T) (string, []string) {
	t.Helper()
	if err := <-f.done; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.data.String(), f.frames
}

// A run's output through the runner's listener and through the output
// service: a line shows on both before the run ends; the running check
// says where to read it; at the end both have the same bytes, the run's
// files are kept (not a link out of its outputs, not past the bounds)
// and listed, and served by both.
func TestRunThroughTheListenerAndTheService(t *testing.T) {
	t.Parallel()
	url, tokens := service(t)
	l, stop := start(t, live.Config{Listen: "127.0.0.1:0", Service: url, ServiceDID: serviceDID,
		Files: live.FilesConfig{MaxRunBytes: 100}}, tokens)
	j := &job.Job{Key: key}
	if got := l.Where(key); got != nil {
		t.Errorf("before the run: live %+v", got)
	}
	w := l.Open(j, "r1", nil, nil)
	if w == nil {
		t.Fatal("no live output")
	}
	if diff := cmp.Diff(&forge.LiveOutput{Service: url, Page: url + "/runs/" + string(runner) + "/" + key}, l.Where(key)); diff != "" {
		t.Errorf("where (-want +got):\n%s", diff)
	}
	direct := &outputhttp.Client{Base: "http://" + l.Addr().String()}
	through := &outputhttp.Client{Base: url}
	_, _ = io.WriteString(w, "==> step 1/1: build\n")
	fd, fs := follow(direct, "compiling"), follow(through, "compiling")
	_, _ = io.WriteString(w, "compiling\n")
	fd.seen(t, "compiling")
	fs.seen(t, "compiling")

	_, _ = io.WriteString(w, "<== step build: success\n")
	out := t.TempDir()
	for name, body := range map[string]string{"report.txt": "all good", "dir/b.txt": "b", "big.bin": strings.Repeat("x", 200)} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(out, name)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("not an output"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(out, "link")); err != nil {
		t.Fatal(err)
	}
	l.Ended(j, "r1", &run.Result{Status: run.Success, Outputs: []string{"big.bin", "dir/b.txt", "link", "report.txt"},
		Artifacts: []string{"big.bin", "dir/b.txt", "link", "report.txt"}}, out)
	want := "==> step 1/1: build\ncompiling\n<== step build: success\n"
	for name, f := range map[string]*follower{"the listener": fd, "the service": fs} {
		got, frames := f.end(t)
		if got != want || frames[0] != "run r1" || frames[len(frames)-1] != "end success" {
			t.Errorf("through %s: %q, frames %q; want %q from run r1 to its end", name, got, frames, want)
		}
	}
	wantFiles := []forge.RunFile{{Path: "dir/b.txt", Size: 1}, {Path: "report.txt", Size: 8}}
	if diff := cmp.Diff(wantFiles, l.Files(key)); diff != "" {
		t.Errorf("files kept (-want +got):\n%s", diff)
	}
	if l.Where(key) != nil {
		t.Error("an ended run still says where its live output is (the running check is written once)")
	}
	stop() // waits for the ended run's push, files included
	got, err := through.Get(context.Background(), check, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != want || !got.Final || got.Status != "success" || len(got.Files) != 2 {
		t.Errorf("the service has %q final %v %s, files %v", got.Data, got.Final, got.Status, got.Files)
	}
	if body, err := httpGet(url + "/xrpc/dev.knotless.getRunFile?check=" + check + "&path=report.txt"); err != nil || body != "all good" {
		t.Errorf("the service's getRunFile: %q, %v", body, err)
	}
}

// waitRun waits until the host has the check's output of run.
func waitRun(t *testing.T, c *outputhttp.Client, run string) {
	t.Helper()
	for {
		out, err := c.Get(context.Background(), check, 0, 0)
		if err == nil && out.Run == run {
			return
		}
		if err != nil && !outputhttp.IsError(err, "RunNotFound") {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // the pusher's first put is on its way
	}
}

func httpGet(u string) (string, error) {
	resp, err := http.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	return string(b), err
}

// The runner's listener serves the run's kept files for download.
func TestListenerServesFiles(t *testing.T) {
	t.Parallel()
	l, _ := start(t, live.Config{Listen: "127.0.0.1:0"}, &servicetest.Tokens{})
	j := &job.Job{Key: key}
	w := l.Open(j, "r1", nil, nil)
	_, _ = io.WriteString(w, "made a report\n")
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "report.txt"), []byte("all good"), 0o600); err != nil {
		t.Fatal(err)
	}
	l.Ended(j, "r1", &run.Result{Status: run.Success, Outputs: []string{"report.txt"}, Artifacts: []string{"report.txt"}}, out)
	if err := os.RemoveAll(out); err != nil { // as the scheduler does after the final check
		t.Fatal(err)
	}
	base := "http://" + l.Addr().String()
	if where := l.Where(key); where != nil {
		t.Errorf("ended: where %+v", where)
	}
	got, err := (&outputhttp.Client{Base: base}).Get(context.Background(), check, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != "made a report\n" || len(got.Files) != 1 || got.Files[0].Path != "report.txt" {
		t.Errorf("get: %+v", got)
	}
	resp, err := httpGet(base + "/xrpc/dev.knotless.getRunFile?check=" + check + "&path=report.txt")
	if err != nil || resp != "all good" {
		t.Errorf("getRunFile: %q, %v", resp, err)
	}
}

// A run handed over at a stop goes on in the successor with its stream
// seeded from the log handed over: a subscriber of the output service,
// on one connection across both processes, sees every byte once. A run
// its runner lost (killed: nothing handed over) and ran again under the
// same check is replaced: the subscriber sees the new run's #run and its
// bytes from offset 0.
func TestHandoverAndLostRunThroughTheService(t *testing.T) {
	t.Parallel()
	url, tokens := service(t)
	cfg := live.Config{Service: url, ServiceDID: serviceDID}
	j := &job.Job{Key: key}
	through := &outputhttp.Client{Base: url}

	first, stopFirst := start(t, cfg, tokens)
	w := first.Open(j, "r1", nil, nil)
	_, _ = io.WriteString(w, "before the handover\n")
	f := follow(through, "before the handover")
	f.seen(t, "before the handover")
	_, _ = io.WriteString(w, "held by the first process\n")
	prior := []byte("before the handover\nheld by the first process\n")
	stopFirst() // the handover: the run is not ended; its push stops

	second, stopSecond := start(t, cfg, tokens)
	w = second.Open(j, "r1", prior, &run.Handover{LogSize: int64(len(prior))})
	_, _ = io.WriteString(w, "after the handover\n")
	second.Ended(j, "r1", &run.Result{Status: run.Success}, t.TempDir())
	got, frames := f.end(t)
	if want := string(prior) + "after the handover\n"; got != want {
		t.Errorf("across the handover: %q, want %q (frames %q)", got, want, frames)
	}
	stopSecond()

	// A lost run: its process killed (its stream never ended, its push
	// gone with it), the work run again as r3 under the same check.
	third, _ := start(t, cfg, tokens)
	w = third.Open(j, "r2", nil, nil)
	_, _ = io.WriteString(w, "the lost run\n")
	waitRun(t, through, "r2")
	f = follow(through, "the lost run")
	f.seen(t, "the lost run")
	fourth, _ := start(t, cfg, tokens)
	w = fourth.Open(j, "r3", nil, nil)
	_, _ = io.WriteString(w, "the run again\n")
	fourth.Ended(j, "r3", &run.Result{Status: run.Success}, t.TempDir())
	_, frames = f.end(t)
	want := []string{"run r2", `0 "the lost run\n"`, "run r3", `0 "the run again\n"`, "end success"}
	if diff := cmp.Diff(want, frames); diff != "" {
		t.Errorf("a lost run run again (-want +got):\n%s", diff)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  live.Config
		want string
	}{
		{live.Config{}, ""},
		{live.Config{Listen: "127.0.0.1:8788"}, ""},
		{live.Config{Listen: ":8788"}, "--public-url"},
		{live.Config{Listen: "0.0.0.0:8788"}, "--public-url"},
		{live.Config{Listen: "0.0.0.0:8788", PublicURL: "https://ci.example/"}, ""},
		{live.Config{Listen: "nonsense"}, "--listen"},
		{live.Config{Service: "https://out.example"}, "--output-service-did"},
		{live.Config{Service: "https://out.example", ServiceDID: "did:web:out.example"}, ""},
		{live.Config{Service: "ftp://out.example", ServiceDID: "did:web:out.example"}, "--output-service"},
		{live.Config{ServiceDID: "did:web:out.example"}, "--output-service-did without"},
		{live.Config{PublicURL: "https://ci.example"}, "--public-url without"},
		{live.Config{Listen: "127.0.0.1:8788", PublicURL: "ci.example"}, "--public-url"},
	} {
		err := tc.cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// Readers cannot stop a run's push: with every reader's place of the
// runner's hub taken through its listener, a run's output still
// reaches the output service.
func TestPushGoesOnWithEveryReadersPlaceTaken(t *testing.T) {
	t.Parallel()
	url, tokens := service(t)
	l, stop := start(t, live.Config{Listen: "127.0.0.1:0", Service: url, ServiceDID: serviceDID,
		Hub: output.HubConfig{Limits: output.RunnerLimits(), MaxSubscribers: 2}}, tokens)
	direct := &outputhttp.Client{Base: "http://" + l.Addr().String()}
	w := l.Open(&job.Job{Key: key}, "r1", nil, nil)
	_, _ = io.WriteString(w, "first\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		following := make(chan error, 1)
		go func() {
			err := direct.Subscribe(ctx, check, 0, func(ev outputhttp.Event) error {
				if ev.Run != nil {
					following <- nil
				}
				return nil
			})
			following <- err
		}()
		if err := <-following; err != nil {
			t.Fatalf("reader %d: %v", i+1, err)
		}
	}
	if err := direct.Subscribe(ctx, check, 0, func(outputhttp.Event) error { return nil }); !outputhttp.IsError(err, "TooManySubscribers") {
		t.Fatalf("a third reader of a hub of 2: %v", err)
	}
	const other = "zsvmur6bdrvdcvafwfoo7mmwp5"
	w2 := l.Open(&job.Job{Key: other}, "r2", nil, nil)
	_, _ = io.WriteString(w2, "pushed all the same\n")
	l.Ended(&job.Job{Key: other}, "r2", &run.Result{Status: run.Success}, t.TempDir())
	stop() // waits for the ended run's push
	got, err := (&outputhttp.Client{Base: url}).Get(context.Background(), "at://"+string(runner)+"/dev.knotless.check/"+other, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != "pushed all the same\n" || !got.Final {
		t.Errorf("the service has %q, final %v", got.Data, got.Final)
	}
}

// dropped is a slog handler that tells when an answer's write failed.
type dropped chan error

func (d dropped) Enabled(context.Context, slog.Level) bool { return true }
func (d dropped) WithAttrs([]slog.Attr) slog.Handler       { return d }
func (d dropped) WithGroup(string) slog.Handler            { return d }
func (d dropped) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "write run output" {
		return nil
	}
	var err error
	r.Attrs(func(a slog.Attr) bool {
		if e, ok := a.Value.Any().(error); ok {
			err = e
		}
		return true
	})
	select {
	case d <- err:
	default:
	}
	return nil
}

// A reader of the listener that stops reading is dropped once a write
// has waited WriteTimeout.
func TestListenerDropsAStalledReader(t *testing.T) {
	t.Parallel()
	log := make(dropped, 1)
	l := live.New(live.Config{Listen: "127.0.0.1:0", WriteTimeout: 200 * time.Millisecond}, runner, filepath.Join(t.TempDir(), "files"), live.Ports{}, slog.New(log))
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Serve())
	w := l.Open(&job.Job{Key: key}, "r1", nil, nil)
	_, _ = w.Write(bytes.Repeat([]byte(strings.Repeat("x", 1023)+"\n"), 1024))
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Answers asked for one after the other on the connection: more
	// than the kernel's buffers of a loopback connection hold.
	get := "GET /xrpc/dev.knotless.getRunOutput?limit=1048576&check=" + url.QueryEscape(check) + " HTTP/1.1\r\nHost: runner.test\r\n\r\n"
	if _, err := io.WriteString(conn, strings.Repeat(get, 16)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-log:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("the stalled answer ended with %v, want a timeout", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the stalled reader was not dropped in a minute")
	}
}
