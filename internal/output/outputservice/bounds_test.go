//go:build unix

package outputservice_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"

	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputservice"
	"knotless.dev/run/internal/output/outputservice/servicetest"
)

// Runners whose keys are in the directory of servicetest.
const (
	runnerA = syntax.DID("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
	runnerB = syntax.DID("did:plc:bbbbbbbbbbbbbbbbbbbbbbbb")
	runnerC = syntax.DID("did:plc:cccccccccccccccccccccccc")
)

func checkOf(runner syntax.DID, key string) string {
	return "at://" + runner.String() + "/dev.knotless.check/" + key
}

// token mints a token of tk for this service and lxm, good for ten
// minutes.
func token(t *testing.T, tk *servicetest.Tokens, lxm string) string {
	t.Helper()
	tok, err := tk.ServiceAuth(context.Background(), serviceDID, lxm, time.Now().Add(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// dial opens a connection to the service at base and sends it head, a
// request's head ending with its blank line. The connection's receive
// buffer is small (set before it connects, so that its window is
// small from the start), so that an answer it does not read fills the
// service's buffers in a few MiB.
func dial(t *testing.T, base, head string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	c, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c
}

// dropped reports whether the service closes c within d, reading (and
// dropping) whatever it answers first.
func dropped(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// A connection that holds the service without sending what it owes is
// dropped: a put whose body never comes (ReadTimeout), a file put that
// dribbles its body (FileTimeout), a keep-alive connection left idle
// (IdleTimeout). A file put that takes longer than ReadTimeout, and a
// download longer than WriteTimeout, still complete within FileTimeout.
func TestSlowConnectionsAreDropped(t *testing.T) {
	t.Parallel()
	const short, writeTimeout = 300 * time.Millisecond, time.Second
	base, tokens := servicetest.StartRunners(t, servicetest.Config{ServiceDID: serviceDID,
		Store: output.StoreConfig{Limits: output.Limits{Head: 1 << 20, Tail: 1 << 20}, MaxRunsPerRunner: 4, MaxFiles: 4, MaxFileBytes: 64 << 20, Retention: time.Hour},
		Service: func(c *outputservice.Config) {
			c.ReadTimeout, c.IdleTimeout, c.WriteTimeout = short, short, writeTimeout
			c.FileTimeout = 10 * time.Second
		},
	}, runnerA)
	a := tokens[0]
	check := checkOf(runnerA, "3kslowslowslowslowslowslow")
	if got := call(t, context.Background(), base, output.MethodPut, token(t, a, output.MethodPut), output.PutInput{Check: check, Run: "r1", Data: []byte("hi\n")}); got != "" {
		t.Fatalf("the first put: %q", got)
	}
	// Far more than any of the service's timeouts, so that a slow
	// machine does not fail the test; a connection never dropped waits
	// it out.
	const patience = 30 * time.Second
	fileHead := func(size int) string {
		q := url.Values{"check": {check}, "run": {"r1"}, "path": {"big.bin"}}
		return fmt.Sprintf("POST /xrpc/%s?%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n",
			output.MethodPutFile, q.Encode(), token(t, a, output.MethodPutFile), size)
	}

	t.Run("a put whose body never comes", func(t *testing.T) {
		t.Parallel()
		c := dial(t, base, fmt.Sprintf("POST /xrpc/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"check\":",
			output.MethodPut, token(t, a, output.MethodPut)))
		if !dropped(c, patience) {
			t.Errorf("the connection was still open after %s", patience)
		}
	})
	t.Run("a file put that dribbles", func(t *testing.T) {
		t.Parallel()
		c := dial(t, base, fileHead(1<<20))
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		go func() {
			for ctx.Err() == nil {
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		if !dropped(c, patience) {
			t.Errorf("the connection was still open after %s", patience)
		}
	})
	t.Run("an idle keep-alive connection", func(t *testing.T) {
		t.Parallel()
		// Its own service, whose ReadTimeout (which an idle connection
		// has without an IdleTimeout) is the test's patience.
		base, _ := servicetest.StartRunners(t, servicetest.Config{ServiceDID: serviceDID,
			Store:   output.StoreConfig{Limits: output.Limits{Head: 1 << 20, Tail: 1 << 20}, MaxRunsPerRunner: 4, MaxFiles: 4, MaxFileBytes: 1 << 20, Retention: time.Hour},
			Service: func(c *outputservice.Config) { c.ReadTimeout, c.IdleTimeout = 2*patience, short },
		}, runnerA)
		c := dial(t, base, "GET /xrpc/_health HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("health: %s, close %v", resp.Status, resp.Close)
		}
		if !dropped(c, patience) {
			t.Errorf("the idle connection was still open after %s", patience)
		}
	})
	t.Run("answers never read", func(t *testing.T) {
		t.Parallel()
		// More answers than the sockets' buffers hold, asked at once and
		// not read until WriteTimeout has passed: the service gave up
		// writing them and closed the connection.
		check := checkOf(runnerA, "3kanswersanswersanswersans")
		if got := call(t, context.Background(), base, output.MethodPut, token(t, a, output.MethodPut), output.PutInput{Check: check, Run: "r1", Data: bytes.Repeat([]byte("z"), 1<<20)}); got != "" {
			t.Fatalf("the first put: %q", got)
		}
		const asked = 12
		get := "GET /xrpc/" + output.MethodGet + "?" + url.Values{"check": {check}, "limit": {"1048576"}}.Encode() + " HTTP/1.1\r\nHost: x\r\n\r\n"
		c := dial(t, base, strings.Repeat(get, asked))
		time.Sleep(3 * writeTimeout)
		r := bufio.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(patience))
		answered := 0
		for ; answered < asked; answered++ {
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				break
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil {
				break
			}
		}
		if answered == asked {
			t.Errorf("all %d answers came, none was given up", asked)
		}
	})
	t.Run("a file put longer than ReadTimeout", func(t *testing.T) {
		t.Parallel()
		const part = 64 << 10
		c := dial(t, base, fileHead(4*part))
		for range 4 {
			time.Sleep(short)
			if _, err := c.Write(bytes.Repeat([]byte("y"), part)); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(patience))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("the slow file put: %s %s", resp.Status, body)
		}
	})
	t.Run("a download longer than WriteTimeout", func(t *testing.T) {
		t.Parallel()
		// Larger than the service's socket buffers, read steadily but
		// slowly: the service is still writing it when WriteTimeout has
		// passed.
		const size, piece = 8 << 20, 256 << 10
		check := checkOf(runnerA, "3kdowndowndowndowndowndown")
		if got := call(t, context.Background(), base, output.MethodPut, token(t, a, output.MethodPut), output.PutInput{Check: check, Run: "r1", Data: []byte("hi\n")}); got != "" {
			t.Fatalf("the first put: %q", got)
		}
		q := url.Values{"check": {check}, "run": {"r1"}, "path": {"big.bin"}}
		req, _ := http.NewRequest(http.MethodPost, base+"/xrpc/"+output.MethodPutFile+"?"+q.Encode(), bytes.NewReader(make([]byte, size)))
		req.Header.Set("Authorization", "Bearer "+token(t, a, output.MethodPutFile))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("put the file: %s", resp.Status)
		}
		c := dial(t, base, "GET /xrpc/"+output.MethodGetFile+"?"+url.Values{"check": {check}, "path": {"big.bin"}}.Encode()+" HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(patience))
		resp, err = http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		start, n := time.Now(), int64(0)
		for err == nil {
			var m int64
			m, err = io.CopyN(io.Discard, resp.Body, piece)
			n += m
			time.Sleep(2 * writeTimeout / (size / piece)) // twice WriteTimeout in all
		}
		if resp.StatusCode != http.StatusOK || n != size || err != io.EOF {
			t.Errorf("the download (%s): %s, %d bytes of %d, %v", time.Since(start), resp.Status, n, size, err)
		}
	})
}

// Puts in flight are bounded, all runners together and each runner to
// a quarter of them: past either, a put is answered TooManyPuts at
// once, and a runner holding its puts open leaves room for the others.
func TestPutsInFlightAreBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base, tokens := servicetest.StartRunners(t, servicetest.Config{ServiceDID: serviceDID,
		Store: output.StoreConfig{Limits: output.Limits{Head: 1 << 20, Tail: 1 << 20}, MaxRunsPerRunner: 4, MaxFiles: 4, MaxFileBytes: 1 << 20, Retention: time.Hour},
		// Two at once, and so one a runner.
		Service: func(c *outputservice.Config) { c.MaxPutsInFlight = 2 },
	}, runnerA, runnerB, runnerC)
	// Each runner's puts are retries of its first, with its one token.
	toks := map[syntax.DID]string{}
	for _, tk := range tokens {
		toks[tk.DID] = token(t, tk, output.MethodPut)
	}
	put := func(tk *servicetest.Tokens) string {
		return call(t, ctx, base, output.MethodPut, toks[tk.DID], output.PutInput{Check: checkOf(tk.DID, "3kflightflightflightflight"), Run: "r1", Data: []byte("hi\n")})
	}
	for _, tk := range tokens {
		if got := put(tk); got != "" {
			t.Fatalf("%s's first put: %q", tk.DID, got)
		}
	}
	// hold makes a file put of tk that is in flight when it returns, and
	// whose body comes only when release is closed. It asks to continue
	// (Expect: 100-continue), so it knows when the service has admitted
	// it (100 Continue: the handler reads the body); a put refused
	// before that (a probe had the place for a moment) is made again.
	var held sync.WaitGroup
	release := make(chan struct{})
	const body = "held and let go\n"
	hold := func(tk *servicetest.Tokens) {
		t.Helper()
		q := url.Values{"check": {checkOf(tk.DID, "3kflightflightflightflight")}, "run": {"r1"}, "path": {"held.txt"}}
		head := "POST /xrpc/" + output.MethodPutFile + "?" + q.Encode() + " HTTP/1.1\r\nHost: x\r\n" +
			"Authorization: Bearer " + token(t, tk, output.MethodPutFile) + "\r\nExpect: 100-continue\r\n" +
			fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body))
		for {
			c := dial(t, base, head)
			dl, _ := ctx.Deadline()
			_ = c.SetReadDeadline(dl)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s's held put: %v", tk.DID, err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable {
				c.Close()
				time.Sleep(5 * time.Millisecond) // a probe had the place: again
				continue
			}
			if resp.StatusCode != http.StatusContinue {
				t.Fatalf("%s's held put: %s, want 100 Continue", tk.DID, resp.Status)
			}
			held.Go(func() {
				<-release
				_, err := io.WriteString(c, body)
				if err == nil {
					resp, err = http.ReadResponse(br, nil)
				}
				if err != nil {
					t.Errorf("%s's held put: %v", tk.DID, err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%s's held put: %s", tk.DID, resp.Status)
				}
			})
			return
		}
	}
	// refusedSoon waits until tk's put is refused: its held put is being
	// served.
	refusedSoon := func(tk *servicetest.Tokens) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for {
			got := put(tk)
			if got == "TooManyPuts" {
				return
			}
			if got != "" {
				t.Fatalf("%s's put: %q", tk.DID, got)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s's puts were never refused", tk.DID)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	a, b, c := tokens[0], tokens[1], tokens[2]
	hold(a)
	refusedSoon(a) // a has its one put in flight
	if got := put(b); got != "" {
		t.Errorf("b's put while a holds its share: %q", got)
	}
	hold(b)
	refusedSoon(c) // both places are taken
	close(release)
	held.Wait()
	for _, tk := range tokens {
		if got := put(tk); got != "" {
			t.Errorf("%s's put once the held ones ended: %q", tk.DID, got)
		}
	}
}

// records is a slog handler that keeps every record.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

func (h *records) all() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.recs...)
}

// A flood of refused puts costs a bounded number of log lines, then one
// line that counts the rest; the issuer a requester chose reaches the
// log with its control characters escaped.
func TestRefusedPutsAreLoggedBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := &records{}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	base, _ := servicetest.StartRunners(t, servicetest.Config{ServiceDID: serviceDID,
		Store:   output.StoreConfig{Limits: output.Limits{Head: 1 << 20, Tail: 1 << 20}, MaxRunsPerRunner: 4, MaxFiles: 4, MaxFileBytes: 1 << 20, Retention: time.Hour},
		Service: func(c *outputservice.Config) { c.Logger, c.Now = slog.New(logs), clock },
	}, runnerA)

	// A token of an issuer no runner here, with a terminal's escapes, a
	// new line, DEL and a C1 control in its name (unsigned: it is refused
	// before any key is looked up).
	evil := "did:plc:\x1b[2J\x1b]0;owned\x07\nlevel=ERROR msg=forged\x7f\u009b31m"
	bad, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Issuer: evil, ID: "x", ExpiresAt: jwt.NewNumericDate(now.Add(time.Minute))}).SignedString([]byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	in := output.PutInput{Check: checkOf(runnerA, "3kfloodfloodfloodfloodfloo"), Run: "r1", Data: []byte("hi\n")}
	const flood = 1000
	for i := range flood {
		tok, want := "", "AuthenticationRequired"
		if i%2 == 0 {
			tok, want = bad, "RunnerNotAllowed"
		}
		if got := call(t, ctx, base, output.MethodPut, tok, in); got != want {
			t.Fatalf("put %d: %q, want %q", i, got, want)
		}
	}
	refused := func(recs []slog.Record) (lines, held int) {
		for _, r := range recs {
			switch r.Message {
			case "put refused":
				lines++
			case "puts refused and not logged":
				r.Attrs(func(a slog.Attr) bool {
					if a.Key == "count" {
						held += int(a.Value.Int64())
					}
					return true
				})
			}
		}
		return lines, held
	}
	recs := logs.all()
	if lines, _ := refused(recs); lines > outputservice.RefusalLogBurst || len(recs) > outputservice.RefusalLogBurst {
		t.Errorf("%d refused puts made %d log lines (%d of them put refused), want at most %d", flood, len(recs), lines, outputservice.RefusalLogBurst)
	}
	var issuers int
	for _, r := range recs {
		r.Attrs(func(a slog.Attr) bool {
			s := a.Value.String()
			if a.Key == "issuer" {
				issuers++
			}
			for _, c := range s {
				if c < 0x20 || c >= 0x7f && c < 0xa0 {
					t.Errorf("log line %q: %s=%q has the control character %U", r.Message, a.Key, s, c)
					break
				}
			}
			return true
		})
	}
	if issuers == 0 {
		t.Error("no refusal logged its issuer")
	}

	// A minute on, the next refusal says how many were not logged.
	mu.Lock()
	now = now.Add(outputservice.RefusalLogEvery)
	mu.Unlock()
	if got := call(t, ctx, base, output.MethodPut, "", in); got != "AuthenticationRequired" {
		t.Fatalf("the put a minute on: %q", got)
	}
	lines, held := refused(logs.all())
	if lines+held != flood+1 || lines > 2*outputservice.RefusalLogBurst {
		t.Errorf("%d refused puts: %d logged and %d counted, want all %d said in at most %d lines", flood+1, lines, held, flood+1, 2*outputservice.RefusalLogBurst+1)
	}
}
