package outputservice_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/output/outputpush"
	"knotless.dev/run/internal/output/outputservice"
	"knotless.dev/run/tests/pds"
)

const serviceDID = "did:web:output.test"

// world is a real PDS with a runner account (logged in with an app
// password, as the daemon is) and a stranger, and an output service
// that takes the runner's output.
type world struct {
	pds      *pds.Server
	runner   *pdsclient.Account
	stranger *pdsclient.Account
	dataDir  string
	pdsDir   string
	stop     func()
	addr     string
	url      string
	cat      *pdsclient.Catalog

	// configure, when set, changes the service's config.
	configure func(*world, *outputservice.Config)
}

func newWorld(t *testing.T, ctx context.Context, configure func(*world, *outputservice.Config)) *world {
	t.Helper()
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	pdsDir := t.TempDir()
	srv, err := pds.Start(ctx, pdsDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	_, runnerAcct, password, err := srv.OwnerAndRunner(ctx, "output")
	if err != nil {
		t.Fatal(err)
	}
	strangerAcct, err := srv.CreateAccount(ctx, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	login := func(did syntax.DID, pw string) *pdsclient.Account {
		a, _, err := pdsclient.Login(ctx, pdsclient.LoginConfig{Host: srv.URL, Identifier: did.String(), Password: pw}, cat)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	w := &world{pds: srv, runner: login(runnerAcct.DID, password), stranger: login(strangerAcct.DID, strangerAcct.Password), dataDir: t.TempDir(), pdsDir: pdsDir, configure: configure, cat: cat}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.addr = ln.Addr().String()
	w.url = "http://" + w.addr
	w.stop = w.serve(t, ctx, ln)
	return w
}

// serve starts the output service on ln and returns the function that
// stops it and waits for it.
func (w *world) serve(t *testing.T, ctx context.Context, ln net.Listener) func() {
	t.Helper()
	store, err := output.OpenStore(output.StoreConfig{
		Dir: w.dataDir, Limits: output.Limits{Head: 1 << 20, Tail: 1 << 20},
		MaxRunsPerRunner: 8, MaxFiles: 4, MaxFileBytes: 1 << 20, Retention: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := outputservice.Config{
		ServiceDID: serviceDID, Runners: []string{w.runner.DID().String()},
		Directory: pdsclient.NewDirectory(pdsclient.DirectoryConfig{PLCURL: w.pds.PLCURL}),
		Store:     store, Catalog: w.cat, Leeway: time.Millisecond,
	}
	if w.configure != nil {
		w.configure(w, &cfg)
	}
	svc, err := outputservice.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Serve(sctx, ln) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (w *world) check(key string) string {
	return "at://" + w.runner.DID().String() + "/dev.knotless.check/" + key
}

func (w *world) pusher(t *testing.T) *outputpush.Pusher {
	t.Helper()
	p, err := outputpush.New(outputpush.Config{Service: w.url, ServiceDID: serviceDID, Tokens: w.runner, Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// follow subscribes to the service's stream of check to its end.
func follow(ctx context.Context, base, check string) (string, error) {
	c := &outputhttp.Client{Base: base}
	var b strings.Builder
	for {
		err := c.Subscribe(ctx, check, int64(b.Len()), func(ev outputhttp.Event) error {
			if ev.Chunk != nil {
				if ev.Chunk.Offset != int64(b.Len()) {
					return fmt.Errorf("chunk at %d, want %d", ev.Chunk.Offset, b.Len())
				}
				b.Write(ev.Chunk.Data)
			}
			if ev.Gap != nil {
				return fmt.Errorf("gap %+v", ev.Gap)
			}
			return nil
		})
		if err == nil {
			return b.String(), nil
		}
		if ctx.Err() != nil || !outputhttp.IsError(err, "RunNotFound") && !strings.Contains(err.Error(), "connection refused") && !strings.Contains(err.Error(), "close") && !strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "reset") {
			return b.String(), err
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return b.String(), ctx.Err()
		}
	}
}

// A run's output pushed by the runner (tokens from its real PDS) reaches
// a subscriber of the output service line by line, the same bytes as the
// runner's stream, through a restart of the service: the pusher goes on
// from the offset the service acknowledged, nothing twice, nothing lost.
func TestPushThroughTheService(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, nil)
	check := w.check("3kpushpushpushpushpushpush")
	s := output.NewStream(check, "r1", output.RunnerLimits())
	p := w.pusher(t)
	pushed := make(chan error, 1)
	go func() { pushed <- p.Push(ctx, s) }()

	got := make(chan string, 1)
	go func() {
		b, err := follow(ctx, w.url, check)
		if err != nil {
			t.Errorf("follow: %v", err)
		}
		got <- b
	}()
	var want strings.Builder
	write := func(from, to int) {
		for i := from; i < to; i++ {
			line := fmt.Sprintf("line %d \x1b[32mgreen\x1b[0m\n", i)
			_, _ = s.Write([]byte(line))
			want.WriteString(line)
		}
	}
	write(0, 500)
	// The service has what was written: the subscriber sees it while the
	// run goes on.
	c := &outputhttp.Client{Base: w.url}
	waitFor(t, ctx, func() bool { out, err := c.Get(ctx, check, 0, 0); return err == nil && out.Size == int64(want.Len()) })

	// The service goes away and comes back on the same address and data.
	// (The stop closes the subscriber's connection; it comes back from
	// its offset.)
	w.restart(t, ctx)
	write(500, 1000)
	s.End("success")
	if err := <-pushed; err != nil {
		t.Fatalf("push: %v", err)
	}
	b := <-got
	if b != want.String() {
		t.Errorf("the subscriber got %d bytes, want the %d written", len(b), want.Len())
	}
	out, err := c.Get(ctx, check, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Final || out.Status != "success" || string(out.Data) != want.String() {
		t.Errorf("the service's stream: final %v %q, %d bytes", out.Final, out.Status, len(out.Data))
	}

	// Files: put by the runner, downloaded by anyone.
	f, err := p.PutFile(ctx, check, "r1", "reports/junit.xml", strings.NewReader("<testsuite/>"))
	if err != nil || f.Size != 12 {
		t.Fatalf("put file: %+v %v", f, err)
	}
	resp, err := http.Get(w.url + "/xrpc/dev.knotless.getRunFile?check=" + check + "&path=reports/junit.xml")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "<testsuite/>" {
		t.Errorf("downloaded %q", body)
	}
	if out, _ := c.Get(ctx, check, 0, 0); len(out.Files) != 1 || out.Files[0].Path != "reports/junit.xml" {
		t.Errorf("files listed: %+v", out.Files)
	}

	t.Run("handover", func(t *testing.T) {
		// A successor process seeds its stream with the log its
		// predecessor handed over and pushes from what the service has:
		// no byte twice, none lost.
		check := w.check("3khandoverhandoverhandover")
		first := output.NewStream(check, "r2", output.RunnerLimits())
		_, _ = first.Write([]byte("before the handover\n"))
		pctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.pusher(t).Push(pctx, first) }()
		waitFor(t, ctx, func() bool { out, err := c.Get(ctx, check, 0, 0); return err == nil && out.Size == first.Size() })
		_, _ = first.Write([]byte("written as the first process stopped\n"))
		stop()
		<-done
		kept, _ := first.Log()
		next := output.NewStream(check, "r2", output.RunnerLimits())
		if err := next.Seed(kept, first.Size()); err != nil {
			t.Fatal(err)
		}
		_, _ = next.Write([]byte("after the handover\n"))
		next.End("success")
		if err := w.pusher(t).Push(ctx, next); err != nil {
			t.Fatal(err)
		}
		out, _ := c.Get(ctx, check, 0, 1<<20)
		if want := "before the handover\nwritten as the first process stopped\nafter the handover\n"; string(out.Data) != want || !out.Final {
			t.Errorf("the service has %q (final %v), want %q", out.Data, out.Final, want)
		}
	})

	t.Run("behind the kept tail", func(t *testing.T) {
		// A pusher that starts after the stream cut bytes it never sent
		// says so, and the service records them as cut.
		check := w.check("3kbehindbehindbehindbehind")
		s := output.NewStream(check, "r3", output.Limits{Head: 10, Tail: 10, Marks: 10, Subscribers: 2})
		_, _ = s.Write([]byte("0123456789--------------------abcdefghij"))
		s.End("failure")
		if err := w.pusher(t).Push(ctx, s); err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		err := c.Subscribe(ctx, check, 0, func(ev outputhttp.Event) error {
			switch {
			case ev.Chunk != nil:
				got.Write(ev.Chunk.Data)
			case ev.Gap != nil:
				fmt.Fprintf(&got, "[cut %d]", ev.Gap.Next-ev.Gap.Offset)
			}
			return nil
		})
		if err != nil || got.String() != "0123456789[cut 20]abcdefghij" {
			t.Errorf("the service's stream: %q, %v", got.String(), err)
		}
	})
}

// restart stops the service and starts it again on the same address
// with the same data.
func (w *world) restart(t *testing.T, ctx context.Context) {
	t.Helper()
	w.stop()
	ln, err := net.Listen("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	w.stop = w.serve(t, ctx, ln)
}

func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("gave up waiting")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// call puts in with token (none when empty) and returns the XRPC error
// name, or "" when the put was taken.
func call(t *testing.T, ctx context.Context, url, method, token string, in any) string {
	t.Helper()
	b, _ := json.Marshal(in)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/xrpc/"+method, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	var e outputhttp.Error
	var xe *outputhttp.Error
	if err := outputhttp.ReadError(resp); errors.As(err, &xe) {
		e = *xe
	}
	return e.Name
}

// Only the configured runner puts, with a token its own PDS minted for
// this service and this method, for checks in its own repo; a forged,
// expired, replayed, wrong-audience or wrong-method token is refused.
func TestServiceAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, nil)
	mint := func(a *pdsclient.Account, aud, lxm string, exp time.Duration) string {
		t.Helper()
		tok, err := a.ServiceAuth(ctx, aud, lxm, time.Now().Add(exp))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	checkA, checkB := w.check("3kaaaaaaaaaaaaaaaaaaaaaaaa"), w.check("3kbbbbbbbbbbbbbbbbbbbbbbbb")
	in := func(check string) output.PutInput {
		return output.PutInput{Check: check, Run: "r1", Offset: 0, Data: []byte("hello\n")}
	}
	good := mint(w.runner, serviceDID, output.MethodPut, 10*time.Minute)

	priv, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	lxm := syntax.NSID(output.MethodPut)
	forged, err := auth.SignServiceAuth(w.runner.DID(), serviceDID, 10*time.Minute, &lxm, priv)
	if err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(2 * time.Second)
	short := mint(w.runner, serviceDID, output.MethodPut, 2*time.Second)

	for _, tc := range []struct {
		name, token string
		in          output.PutInput
		want        string
	}{
		{"no token", "", in(checkA), "AuthenticationRequired"},
		{"not a token", "nonsense", in(checkA), "InvalidToken"},
		{"a runner not configured", mint(w.stranger, serviceDID, output.MethodPut, time.Minute), in("at://" + w.stranger.DID().String() + "/dev.knotless.check/3kx"), "RunnerNotAllowed"},
		{"another audience", mint(w.runner, "did:web:elsewhere.test", output.MethodPut, time.Minute), in(checkA), "InvalidToken"},
		{"another method", mint(w.runner, serviceDID, output.MethodPutFile, time.Minute), in(checkA), "InvalidToken"},
		{"forged: signed with another key", forged, in(checkA), "InvalidToken"},
		{"a check of another account", good, in("at://" + w.stranger.DID().String() + "/dev.knotless.check/3kx"), "NotYourCheck"},
		{"good", good, in(checkA), ""},
		{"good again: a retry of the put", good, in(checkA), ""},
		{"replayed for another check", good, in(checkB), "TokenReplayed"},
		{"a fresh token for that check", mint(w.runner, serviceDID, output.MethodPut, time.Minute), in(checkB), ""},
	} {
		if got := call(t, ctx, w.url, output.MethodPut, tc.token, tc.in); got != tc.want {
			t.Errorf("%s: error %q, want %q", tc.name, got, tc.want)
		}
	}
	// Expired: the PDS minted it for 2 seconds.
	// Taken before it expires (and so remembered as verified), refused
	// after: the token's expiry is a time, not an event, so wait for it.
	if got := call(t, ctx, w.url, output.MethodPut, short, in(w.check("3kdddddddddddddddddddddddd"))); got != "" {
		t.Errorf("a short token before it expired: error %q", got)
	}
	time.Sleep(time.Until(expires.Add(50 * time.Millisecond)))
	if got := call(t, ctx, w.url, output.MethodPut, short, in(w.check("3kdddddddddddddddddddddddd"))); got != "InvalidToken" {
		t.Errorf("expired: error %q, want InvalidToken", got)
	}
	// Nothing refused reached the store.
	c := &outputhttp.Client{Base: w.url}
	if _, err := c.Get(ctx, "at://"+w.stranger.DID().String()+"/dev.knotless.check/3kx", 0, 0); !outputhttp.IsError(err, "RunNotFound") {
		t.Errorf("a refused put was kept: %v", err)
	}
	if out, err := c.Get(ctx, w.check("3kdddddddddddddddddddddddd"), 0, 100); err != nil || string(out.Data) != "hello\n" {
		t.Errorf("the put before expiry: %v %+v; the put after it was kept, or the first lost", err, out)
	}
}

// pdsKey is the signing key the real PDS keeps for did: what a runner
// running its own PDS holds.
func (w *world) pdsKey(t *testing.T, did syntax.DID) atcrypto.PrivateKey {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(w.pdsDir, "pds-*", "actors", "*", did.String(), "key"))
	if err != nil || len(files) != 1 {
		t.Fatalf("the PDS's key of %s: %v %v", did, files, err)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	key, err := atcrypto.ParsePrivateBytesK256(b)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// A token is remembered against replay until it expires, in its
// runner's share of the table. So a token good for more than an hour
// is refused: the reference PDS grants no longer, but a runner's own
// PDS signs what it is asked. And a runner that filled its share has
// its own new tokens refused until some expire, never another runner's.
func TestTokenBounds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const share = 3
	w := newWorld(t, ctx, func(w *world, c *outputservice.Config) {
		c.Runners = append(c.Runners, w.stranger.DID().String())
		c.MaxTokensPerRunner = share
	})
	mint := func(a *pdsclient.Account, exp time.Duration) string {
		t.Helper()
		tok, err := a.ServiceAuth(ctx, serviceDID, output.MethodPut, time.Now().Add(exp))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	check := w.check("3ktokentokentokentokentoke")
	in := output.PutInput{Check: check, Run: "r1", Data: []byte("hello\n")}
	put := func(tok string, in output.PutInput) string {
		return call(t, ctx, w.url, output.MethodPut, tok, in)
	}

	// Signed with the runner's key by its PDS's rules, but for a day.
	key := w.pdsKey(t, w.runner.DID())
	lxm := syntax.NSID(output.MethodPut)
	sign := func(life time.Duration) string {
		t.Helper()
		tok, err := auth.SignServiceAuth(w.runner.DID(), serviceDID, life, &lxm, key)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	if got := put(sign(24*time.Hour), in); got != "BadExpiration" {
		t.Errorf("a token good for a day: error %q, want BadExpiration", got)
	}
	if got := put(sign(50*time.Minute), in); got != "" {
		t.Errorf("the same key's token good for 50 minutes: error %q", got)
	}
	// The longest the PDS grants.
	kept := mint(w.runner, 59*time.Minute)
	if got := put(kept, in); got != "" {
		t.Errorf("the PDS's token good for 59 minutes: error %q", got)
	}

	// The runner fills its share with fresh tokens.
	used := 2
	for ; used < share; used++ {
		if got := put(mint(w.runner, 10*time.Minute), in); got != "" {
			t.Fatalf("token %d of the runner: error %q", used+1, got)
		}
	}
	if got := put(mint(w.runner, 10*time.Minute), in); got != "TooManyTokens" {
		t.Errorf("token %d of a runner whose share is %d: error %q, want TooManyTokens", used+1, share, got)
	}
	// A token it used is still good for its put's retry.
	if got := put(kept, in); got != "" {
		t.Errorf("a retry with a remembered token: error %q", got)
	}
	// Another runner is not locked out.
	theirs := output.PutInput{Check: "at://" + w.stranger.DID().String() + "/dev.knotless.check/3ktheirstheirstheirstheirs", Run: "r1", Data: []byte("hello\n")}
	if got := put(mint(w.stranger, 10*time.Minute), theirs); got != "" {
		t.Errorf("another runner's token while the first's share is full: error %q", got)
	}
}
