// Package outputservice is knotless-run's output service: runners that
// can only connect outward push their runs' output to it
// (dev.knotless.putRunOutput, dev.knotless.putRunFile), authenticated
// with atproto service auth, and it keeps the output on disk
// (output.Store) and serves it to readers (outputhttp) for many runners.
package outputservice

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
)

// Config configures a Service.
type Config struct {
	// ServiceDID is the service's own DID: the audience a token must
	// name.
	ServiceDID string
	// Runners are the runner DIDs the service takes output from.
	Runners []string
	// Directory resolves a runner's DID document (its signing key).
	Directory identity.Directory
	Store     *output.Store
	Catalog   *pdsclient.Catalog
	Logger    *slog.Logger
	// Leeway is how far a token's times may be off (default 5s).
	Leeway time.Duration
	// SweepEvery is how often runs past retention are removed (default
	// a minute).
	SweepEvery time.Duration
	// MaxTokensPerRunner bounds the tokens remembered against replay for
	// each runner (default 4096); past it, that runner's new tokens are
	// refused (TooManyTokens) until its old ones expire, at most
	// MaxTokenLife later. Another runner's tokens are not.
	MaxTokensPerRunner int
	// MaxPutsInFlight bounds the puts served at once, all runners
	// together (default 64); past it, or past a quarter of it for one
	// runner, a put is answered 503 TooManyPuts at once.
	MaxPutsInFlight int
	// ReadTimeout bounds reading a request, its body included (default a
	// minute); a putRunFile's body has FileTimeout.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing an answer (default 30s); a getRunFile
	// download has FileTimeout. It is also the reads' WriteTimeout
	// (outputhttp.Config): a subscription, a hijacked WebSocket, drops a
	// reader that takes longer to take one frame.
	WriteTimeout time.Duration
	// FileTimeout bounds a putRunFile's body and a getRunFile's download
	// (default 10 minutes: 64 MiB at 110 kB/s).
	FileTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle that long (default
	// 2 minutes).
	IdleTimeout time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// MaxPutBytes bounds a putRunOutput body: 1 MiB of data in base64, and
// its marks.
const MaxPutBytes = 3 << 20

// MaxTokenLife is the furthest ahead a token's exp may be (with the
// leeway): what the reference PDS grants at most, and what bounds how
// long a token is remembered against replay.
const MaxTokenLife = time.Hour

// Refused puts are logged at most RefusalLogBurst a RefusalLogEvery; the
// rest are counted and said in one line.
const (
	RefusalLogBurst = 10
	RefusalLogEvery = time.Minute
)

// Service is the output service.
type Service struct {
	cfg       Config
	runners   map[string]bool
	validator *auth.ServiceAuthValidator
	read      *outputhttp.Handler
	replay    *replay
	inFlight  *inFlight
	refusals  *quiet
}

// New returns the service of cfg.
func New(cfg Config) (*Service, error) {
	if _, err := syntax.ParseDID(cfg.ServiceDID); err != nil {
		return nil, fmt.Errorf("output service: --service-did %q: %w", cfg.ServiceDID, err)
	}
	if len(cfg.Runners) == 0 {
		return nil, errors.New("output service: no --runner: it would take output from no one")
	}
	runners := map[string]bool{}
	for _, r := range cfg.Runners {
		if _, err := syntax.ParseDID(r); err != nil {
			return nil, fmt.Errorf("output service: --runner %q: %w", r, err)
		}
		runners[r] = true
	}
	if cfg.Store == nil || cfg.Directory == nil || cfg.Catalog == nil {
		return nil, errors.New("output service: a store, a directory and a catalog are needed")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Leeway <= 0 {
		cfg.Leeway = 5 * time.Second
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = time.Minute
	}
	if cfg.MaxTokensPerRunner <= 0 {
		cfg.MaxTokensPerRunner = 4096
	}
	if cfg.MaxPutsInFlight <= 0 {
		cfg.MaxPutsInFlight = 64
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = time.Minute
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.FileTimeout <= 0 {
		cfg.FileTimeout = 10 * time.Minute
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 2 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	read, err := outputhttp.New(outputhttp.Config{Source: cfg.Store, Files: cfg.Store, Logger: cfg.Logger, WriteTimeout: cfg.WriteTimeout})
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg:     cfg,
		runners: runners,
		validator: &auth.ServiceAuthValidator{
			Audience: cfg.ServiceDID, Dir: cfg.Directory, TimestampLeeway: cfg.Leeway,
		},
		read:     read,
		replay:   newReplay(cfg.Runners, cfg.MaxTokensPerRunner, cfg.Now, cfg.Leeway),
		inFlight: newInFlight(cfg.MaxPutsInFlight),
		refusals: &quiet{burst: RefusalLogBurst, every: RefusalLogEvery},
	}, nil
}

// Handler serves the service's routes: the puts, the reads of
// outputhttp, and /xrpc/_health.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	s.read.Register(mux)
	mux.HandleFunc("POST /xrpc/"+output.MethodPut, s.put)
	mux.HandleFunc("POST /xrpc/"+output.MethodPutFile, s.putFile)
	mux.HandleFunc("GET /xrpc/_health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	getFile := "/xrpc/" + output.MethodGetFile
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == getFile {
			// A download of a run's file may take longer than an
			// answer (WriteTimeout); a handler served without Serve
			// has no deadline to move.
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.FileTimeout))
		}
		mux.ServeHTTP(w, r)
	})
}

// Serve serves on ln until ctx ends, removing runs past retention as it
// goes; it returns once its connections (subscriptions too) are closed.
func (s *Service) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: min(10*time.Second, s.cfg.ReadTimeout),
		// A request, its body included, is read within ReadTimeout and
		// answered within WriteTimeout; a run's file (put or got) moves
		// its deadlines to FileTimeout.
		ReadTimeout:  s.cfg.ReadTimeout,
		WriteTimeout: s.cfg.WriteTimeout,
		IdleTimeout:  s.cfg.IdleTimeout,
		// Subscriptions live on hijacked connections, which Shutdown
		// does not close: their requests end with ctx.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sweep := time.NewTicker(s.cfg.SweepEvery)
		defer sweep.Stop()
		flush := time.NewTicker(output.PersistEvery)
		defer flush.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-sweep.C:
				s.cfg.Store.Sweep()
				s.replay.purge()
				if n := s.refusals.flush(s.cfg.Now()); n > 0 {
					s.cfg.Logger.Warn("puts refused and not logged", "count", n)
				}
			case <-flush.C:
				if err := s.cfg.Store.Flush(); err != nil {
					s.cfg.Logger.Error("keep output", "err", err)
				}
			}
		}
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err = srv.Shutdown(sctx)
		cancel()
		<-errc
	case err = <-errc:
	}
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, s.cfg.Store.Flush())
}

// refusal is a put refused, with its XRPC error.
type refusal struct {
	status        int
	name, message string
	// issuer is the token's issuer when it is no runner of this service:
	// the requester's choice, escaped (printable).
	issuer string
}

func (r *refusal) Error() string { return r.name + ": " + r.message }

// caller is who a put comes from: the runner its token speaks for, the
// token's id and its expiry.
type caller struct {
	runner, jti string
	exp         time.Time
}

// begin admits a put for method lxm: a place among the puts in flight,
// a token of a runner of this service, and a place among that runner's
// puts in flight. A put it refuses it answers; end is called once an
// admitted put is answered.
func (s *Service) begin(w http.ResponseWriter, r *http.Request, lxm string) (c caller, end func(), ok bool) {
	busy := &refusal{http.StatusServiceUnavailable, "TooManyPuts", "too many puts at once; try again in a moment", ""}
	if !s.inFlight.enter("") {
		w.Header().Set("Retry-After", "1")
		s.refuse(w, r, busy, "")
		return caller{}, nil, false
	}
	c, f := s.authenticate(r, lxm)
	if f == nil && !s.inFlight.enter(c.runner) {
		w.Header().Set("Retry-After", "1")
		f = busy
	}
	if f != nil {
		s.inFlight.leave("")
		s.refuse(w, r, f, c.runner)
		return caller{}, nil, false
	}
	return c, func() { s.inFlight.leave(c.runner); s.inFlight.leave("") }, true
}

// authenticate checks a put's service-auth token for method lxm and
// returns who the put comes from. The runner is set only when the token
// is good.
func (s *Service) authenticate(r *http.Request, lxm string) (caller, *refusal) {
	hdr := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(hdr, "Bearer ")
	if !ok || token == "" {
		return caller{}, &refusal{http.StatusUnauthorized, "AuthenticationRequired", "atproto service auth (Authorization: Bearer) is required", ""}
	}
	// Who the token claims to be, before anything is resolved: only a
	// runner this service takes output from is looked up.
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err != nil {
		return caller{}, &refusal{http.StatusUnauthorized, "InvalidToken", "the token does not parse", ""}
	}
	if !s.runners[claims.Issuer] {
		// The issuer is the requester's choice: logged escaped, and not
		// echoed.
		return caller{}, &refusal{http.StatusForbidden, "RunnerNotAllowed", "the token's issuer is not a runner this service takes output from", printable(claims.Issuer)}
	}
	if claims.ID == "" || claims.ExpiresAt == nil {
		return caller{}, &refusal{http.StatusUnauthorized, "InvalidToken", "the token has no jti or exp", ""}
	}
	// A token is remembered against replay until it expires: one good
	// for years would hold its runner's share of the table as long.
	if life := claims.ExpiresAt.Sub(s.cfg.Now()); life > MaxTokenLife+s.cfg.Leeway {
		return caller{}, &refusal{http.StatusUnauthorized, "BadExpiration", fmt.Sprintf("the token expires in %s; this service takes tokens that expire within %s (ask the PDS for an earlier exp)", life.Round(time.Second), MaxTokenLife), ""}
	}
	exp := claims.ExpiresAt.Time
	// A token verified before, for this method, is not verified again
	// until it expires: its signature cannot have changed.
	if did, ok := s.replay.verified(claims.Issuer, token, lxm); ok {
		return caller{runner: did, jti: claims.ID, exp: exp}, nil
	}
	nsid := syntax.NSID(lxm)
	did, err := s.validator.Validate(r.Context(), token, &nsid)
	if err != nil {
		return caller{}, &refusal{http.StatusUnauthorized, "InvalidToken", fmt.Sprintf("invalid service auth: %v", err), ""}
	}
	s.replay.remember(did.String(), token, lxm, exp)
	return caller{runner: did.String(), jti: claims.ID, exp: exp}, nil
}

// owns checks that check is a dev.knotless.check record in runner's repo.
func owns(runner, check string) *refusal {
	uri, err := syntax.ParseATURI(check)
	if err != nil || uri.Collection().String() != forge.CollectionCheck || uri.RecordKey() == "" {
		return &refusal{http.StatusBadRequest, "InvalidRequest", fmt.Sprintf("check %q is not a dev.knotless.check AT-URI", check), ""}
	}
	if uri.Authority().String() != runner {
		return &refusal{http.StatusForbidden, "NotYourCheck", fmt.Sprintf("check %s is not in %s's repo", check, runner), ""}
	}
	return nil
}

// refuse answers a refused put and logs it, at most RefusalLogBurst a
// RefusalLogEvery: a flood of bad tokens costs a line a minute, not a
// line each.
func (s *Service) refuse(w http.ResponseWriter, r *http.Request, f *refusal, runner string) {
	outputhttp.XRPCError(w, f.status, f.name, f.message)
	ok, held := s.refusals.allow(s.cfg.Now())
	if held > 0 {
		s.cfg.Logger.Warn("puts refused and not logged", "count", held)
	}
	if !ok {
		return
	}
	attrs := []any{"method", strings.TrimPrefix(r.URL.Path, "/xrpc/"), "runner", runner, "error", f.name, "reason", printable(f.message)}
	if f.issuer != "" {
		attrs = append(attrs, "issuer", f.issuer)
	}
	s.cfg.Logger.Warn("put refused", attrs...)
}

// maxLogged is the most bytes of a requester's string a log line shows.
const maxLogged = 512

// printable returns s as a log line may show it: at most maxLogged bytes
// of it, its control characters (C0, DEL, C1, line separators,
// bidirectional overrides), quotes, backslashes and bytes that are not
// UTF-8 escaped as in a Go string literal.
func printable(s string) string {
	cut := len(s) > maxLogged
	if cut {
		s = s[:maxLogged]
	}
	q := strconv.Quote(s)
	q = q[1 : len(q)-1]
	if cut {
		q += "…"
	}
	return q
}

// storeRefusal maps a store's error to its XRPC error.
func storeRefusal(err error) *refusal {
	switch {
	case errors.Is(err, output.ErrTooManyRuns):
		return &refusal{http.StatusTooManyRequests, "TooManyRuns", err.Error(), ""}
	case errors.Is(err, output.ErrRunReplaced):
		return &refusal{http.StatusConflict, "RunReplaced", err.Error(), ""}
	case errors.Is(err, output.ErrNotFound):
		return &refusal{http.StatusNotFound, "RunNotFound", err.Error(), ""}
	case errors.Is(err, output.ErrFileTooLarge):
		return &refusal{http.StatusRequestEntityTooLarge, "FileTooLarge", err.Error(), ""}
	case errors.Is(err, output.ErrTooManyFiles):
		return &refusal{http.StatusRequestEntityTooLarge, "TooManyFiles", err.Error(), ""}
	case errors.Is(err, output.ErrBadPath):
		return &refusal{http.StatusBadRequest, "InvalidRequest", err.Error(), ""}
	}
	return nil
}

// bodyRefusal maps an error reading a put's body to its XRPC error.
func bodyRefusal(err error) *refusal {
	var tooLarge *http.MaxBytesError
	var netErr net.Error
	switch {
	case errors.As(err, &tooLarge):
		return &refusal{http.StatusRequestEntityTooLarge, "PayloadTooLarge", fmt.Sprintf("a put is at most %d bytes", tooLarge.Limit), ""}
	case errors.As(err, &netErr) && netErr.Timeout():
		return &refusal{http.StatusRequestTimeout, "RequestTimeout", "the body did not come in time", ""}
	}
	return &refusal{http.StatusBadRequest, "InvalidRequest", fmt.Sprintf("reading the body: %v", err), ""}
}

// body is a request's body that keeps the error of its reads.
type body struct {
	r   io.Reader
	err error
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func (s *Service) put(w http.ResponseWriter, r *http.Request) {
	c, end, ok := s.begin(w, r, output.MethodPut)
	if !ok {
		return
	}
	defer end()
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxPutBytes))
	if err != nil {
		s.refuse(w, r, bodyRefusal(err), c.runner)
		return
	}
	if err := s.cfg.Catalog.ValidateObject("dev.knotless.putRunOutput#input", raw); err != nil {
		s.refuse(w, r, &refusal{http.StatusBadRequest, "InvalidRequest", err.Error(), ""}, c.runner)
		return
	}
	var in output.PutInput
	if err := json.Unmarshal(raw, &in); err != nil {
		s.refuse(w, r, &refusal{http.StatusBadRequest, "InvalidRequest", err.Error(), ""}, c.runner)
		return
	}
	if f := owns(c.runner, in.Check); f != nil {
		s.refuse(w, r, f, c.runner)
		return
	}
	if f := s.replay.bind(c.jti, binding{runner: c.runner, lxm: output.MethodPut, check: in.Check, run: in.Run, exp: c.exp}); f != nil {
		s.refuse(w, r, f, c.runner)
		return
	}
	out, err := s.cfg.Store.Put(c.runner, in)
	if err != nil {
		if f := storeRefusal(err); f != nil {
			s.refuse(w, r, f, c.runner)
			return
		}
		s.cfg.Logger.Error("keep output", "check", in.Check, "err", err)
		outputhttp.XRPCError(w, http.StatusInternalServerError, "InternalServerError", "keeping the output failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (s *Service) putFile(w http.ResponseWriter, r *http.Request) {
	c, end, ok := s.begin(w, r, output.MethodPutFile)
	if !ok {
		return
	}
	defer end()
	q := r.URL.Query()
	check, run, p := q.Get("check"), q.Get("run"), q.Get("path")
	if f := owns(c.runner, check); f != nil {
		s.refuse(w, r, f, c.runner)
		return
	}
	if run == "" || len(run) > 128 {
		s.refuse(w, r, &refusal{http.StatusBadRequest, "InvalidRequest", "run is required (at most 128 bytes)", ""}, c.runner)
		return
	}
	if f := s.replay.bind(c.jti, binding{runner: c.runner, lxm: output.MethodPutFile, check: check, run: run, exp: c.exp}); f != nil {
		s.refuse(w, r, f, c.runner)
		return
	}
	// A run's file may be large: its body, from a runner, has
	// FileTimeout, where any other request has ReadTimeout. (A handler
	// served without Serve has no deadline to move.)
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.FileTimeout))
	_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.FileTimeout))
	b := &body{r: r.Body}
	file, err := s.cfg.Store.PutFile(c.runner, check, run, p, b)
	_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if err != nil {
		if b.err != nil {
			s.refuse(w, r, bodyRefusal(b.err), c.runner)
			return
		}
		if f := storeRefusal(err); f != nil {
			s.refuse(w, r, f, c.runner)
			return
		}
		s.cfg.Logger.Error("keep a run file", "check", check, "path", p, "err", err)
		outputhttp.XRPCError(w, http.StatusInternalServerError, "InternalServerError", "keeping the file failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(file)
}

// inFlight bounds the puts served at once: all of them (the runner "")
// and each runner's, a quarter of all at most, so that one runner
// holding its puts open leaves room for the others.
type inFlight struct {
	max, perRunner int

	mu sync.Mutex
	n  map[string]int
}

func newInFlight(maxPuts int) *inFlight {
	return &inFlight{max: maxPuts, perRunner: max(1, maxPuts/4), n: map[string]int{}}
}

// enter takes a place for runner, or reports that there is none.
func (b *inFlight) enter(runner string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	limit := b.perRunner
	if runner == "" {
		limit = b.max
	}
	if b.n[runner] >= limit {
		return false
	}
	b.n[runner]++
	return true
}

// leave gives runner's place back.
func (b *inFlight) leave(runner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n[runner]--; b.n[runner] <= 0 {
		delete(b.n, runner)
	}
}

// quiet bounds a log's lines: at most burst an interval of every; the
// lines held back are counted, and said when the interval has ended.
type quiet struct {
	burst int
	every time.Duration

	mu    sync.Mutex
	since time.Time // the interval's start
	n     int       // lines logged in it
	held  int       // lines held back and not yet said
}

// allow reports whether a line may be logged at now, and how many were
// held back in an interval that has ended (to be said first).
func (q *quiet) allow(now time.Time) (ok bool, held int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if now.Sub(q.since) >= q.every || now.Before(q.since) {
		held, q.held = q.held, 0
		q.since, q.n = now, 0
	}
	if q.n < q.burst {
		q.n++
		return true, held
	}
	q.held++
	return false, held
}

// flush returns how many lines were held back, once their interval has
// ended (a log quiet since then says them at the next sweep).
func (q *quiet) flush(now time.Time) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held == 0 || now.Sub(q.since) < q.every {
		return 0
	}
	held := q.held
	q.held, q.since, q.n = 0, now, 0
	return held
}

// binding is what a token was first used for.
type binding struct {
	runner, lxm, check, run string
	exp                     time.Time
}

// replay remembers each token's first use until it expires: a token
// used again for the same runner, method, check and run is that put's
// retry (a put is idempotent), and for anything else it is refused. It
// also remembers the tokens it verified, by their SHA-256, so that a
// runner's token is verified once, not at every put. Each runner has
// its own share of max tokens: one runner that fills its share refuses
// its own new tokens, never another runner's.
type replay struct {
	mu      sync.Mutex
	runners map[string]*remembered
	max     int
	now     func() time.Time
	leeway  time.Duration
}

// remembered is one runner's tokens.
type remembered struct {
	seen map[string]binding         // by jti
	ok   map[[32]byte]verifiedToken // by the token's SHA-256
}

type verifiedToken struct {
	lxm string
	exp time.Time
}

func newReplay(runners []string, maxTokens int, now func() time.Time, leeway time.Duration) *replay {
	c := &replay{runners: map[string]*remembered{}, max: maxTokens, now: now, leeway: leeway}
	for _, r := range runners {
		c.runners[r] = &remembered{seen: map[string]binding{}, ok: map[[32]byte]verifiedToken{}}
	}
	return c
}

// verified reports whether runner's token was verified for lxm and has
// not expired.
func (c *replay) verified(runner, token, lxm string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.runners[runner]
	if !ok {
		return "", false
	}
	v, ok := m.ok[sha256.Sum256([]byte(token))]
	if !ok || v.lxm != lxm || !c.now().Before(v.exp.Add(c.leeway)) {
		return "", false
	}
	return runner, true
}

// remember keeps runner's verified token until it expires.
func (c *replay) remember(runner, token, lxm string, exp time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.runners[runner]
	if !ok {
		return
	}
	if len(m.ok) >= c.max {
		c.purgeLocked(m)
		if len(m.ok) >= c.max {
			return // verified at every use until room frees
		}
	}
	m.ok[sha256.Sum256([]byte(token))] = verifiedToken{lxm: lxm, exp: exp}
}

func (c *replay) bind(jti string, b binding) *refusal {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.runners[b.runner]
	if !ok {
		return &refusal{http.StatusForbidden, "RunnerNotAllowed", fmt.Sprintf("%s is not a runner this service takes output from", b.runner), ""}
	}
	if prev, ok := m.seen[jti]; ok {
		if prev.lxm == b.lxm && prev.check == b.check && prev.run == b.run {
			return nil
		}
		return &refusal{http.StatusUnauthorized, "TokenReplayed", fmt.Sprintf("the token was used for %s of %s run %s", prev.lxm, prev.check, prev.run), ""}
	}
	if len(m.seen) >= c.max {
		c.purgeLocked(m)
		if len(m.seen) >= c.max {
			return &refusal{http.StatusServiceUnavailable, "TooManyTokens", fmt.Sprintf("%s has %d tokens in use, the most this service remembers for a runner; try again when some have expired", b.runner, c.max), ""}
		}
	}
	m.seen[jti] = b
	return nil
}

// purge forgets the tokens that have expired: they are refused anyway.
func (c *replay) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.runners {
		c.purgeLocked(m)
	}
}

func (c *replay) purgeLocked(m *remembered) {
	now := c.now()
	for k, v := range m.seen {
		if now.After(v.exp.Add(c.leeway)) {
			delete(m.seen, k)
		}
	}
	for k, v := range m.ok {
		if now.After(v.exp.Add(c.leeway)) {
			delete(m.ok, k)
		}
	}
}
