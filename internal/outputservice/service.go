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
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/outputhttp"
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
	Catalog   *forge.Catalog
	Logger    *slog.Logger
	// Leeway is how far a token's times may be off (default 5s).
	Leeway time.Duration
	// SweepEvery is how often runs past retention are removed (default
	// a minute).
	SweepEvery time.Duration
	// MaxTokens bounds the tokens remembered against replay (default
	// 100000); past it, new tokens are refused until old ones expire.
	MaxTokens int
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// MaxPutBytes bounds a putRunOutput body: 1 MiB of data in base64, and
// its marks.
const MaxPutBytes = 3 << 20

// Service is the output service.
type Service struct {
	cfg       Config
	runners   map[string]bool
	validator *auth.ServiceAuthValidator
	read      *outputhttp.Handler
	replay    *replay
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
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = 100_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	read, err := outputhttp.New(outputhttp.Config{Source: cfg.Store, Files: cfg.Store, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	return &Service{
		cfg:     cfg,
		runners: runners,
		validator: &auth.ServiceAuthValidator{
			Audience: cfg.ServiceDID, Dir: cfg.Directory, TimestampLeeway: cfg.Leeway,
		},
		read:   read,
		replay: &replay{seen: map[string]binding{}, ok: map[[32]byte]verifiedToken{}, max: cfg.MaxTokens, now: cfg.Now, leeway: cfg.Leeway},
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
	return mux
}

// Serve serves on ln until ctx ends, removing runs past retention as it
// goes; it returns once its connections (subscriptions too) are closed.
func (s *Service) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
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
}

func (r *refusal) Error() string { return r.name + ": " + r.message }

// authenticate checks a put's service-auth token for method lxm and
// returns the runner it speaks for, the token's id and its expiry.
func (s *Service) authenticate(r *http.Request, lxm string) (string, string, time.Time, *refusal) {
	hdr := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(hdr, "Bearer ")
	if !ok || token == "" {
		return "", "", time.Time{}, &refusal{http.StatusUnauthorized, "AuthenticationRequired", "atproto service auth (Authorization: Bearer) is required"}
	}
	// Who the token claims to be, before anything is resolved: only a
	// runner this service takes output from is looked up.
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err != nil {
		return "", "", time.Time{}, &refusal{http.StatusUnauthorized, "InvalidToken", "the token does not parse"}
	}
	if !s.runners[claims.Issuer] {
		return "", "", time.Time{}, &refusal{http.StatusForbidden, "RunnerNotAllowed", fmt.Sprintf("%s is not a runner this service takes output from", claims.Issuer)}
	}
	if claims.ID == "" || claims.ExpiresAt == nil {
		return "", "", time.Time{}, &refusal{http.StatusUnauthorized, "InvalidToken", "the token has no jti or exp"}
	}
	// A token verified before, for this method, is not verified again
	// until it expires: its signature cannot have changed.
	if did, ok := s.replay.verified(token, lxm); ok {
		return did, claims.ID, claims.ExpiresAt.Time, nil
	}
	nsid := syntax.NSID(lxm)
	did, err := s.validator.Validate(r.Context(), token, &nsid)
	if err != nil {
		return "", "", time.Time{}, &refusal{http.StatusUnauthorized, "InvalidToken", fmt.Sprintf("invalid service auth: %v", err)}
	}
	s.replay.remember(token, lxm, did.String(), claims.ExpiresAt.Time)
	return did.String(), claims.ID, claims.ExpiresAt.Time, nil
}

// owns checks that check is a dev.knotless.check record in runner's repo.
func owns(runner, check string) *refusal {
	uri, err := syntax.ParseATURI(check)
	if err != nil || uri.Collection().String() != forge.CollectionCheck || uri.RecordKey() == "" {
		return &refusal{http.StatusBadRequest, "InvalidRequest", fmt.Sprintf("check %q is not a dev.knotless.check AT-URI", check)}
	}
	if uri.Authority().String() != runner {
		return &refusal{http.StatusForbidden, "NotYourCheck", fmt.Sprintf("check %s is not in %s's repo", check, runner)}
	}
	return nil
}

func (s *Service) refuse(w http.ResponseWriter, r *http.Request, f *refusal, runner string) {
	s.cfg.Logger.Warn("put refused", "method", strings.TrimPrefix(r.URL.Path, "/xrpc/"), "runner", runner, "error", f.name, "reason", f.message)
	outputhttp.XRPCError(w, f.status, f.name, f.message)
}

// storeRefusal maps a store's error to its XRPC error.
func storeRefusal(err error) *refusal {
	switch {
	case errors.Is(err, output.ErrTooManyRuns):
		return &refusal{http.StatusTooManyRequests, "TooManyRuns", err.Error()}
	case errors.Is(err, output.ErrRunReplaced):
		return &refusal{http.StatusConflict, "RunReplaced", err.Error()}
	case errors.Is(err, output.ErrNotFound):
		return &refusal{http.StatusNotFound, "RunNotFound", err.Error()}
	case errors.Is(err, output.ErrFileTooLarge):
		return &refusal{http.StatusRequestEntityTooLarge, "FileTooLarge", err.Error()}
	case errors.Is(err, output.ErrTooManyFiles):
		return &refusal{http.StatusRequestEntityTooLarge, "TooManyFiles", err.Error()}
	case errors.Is(err, output.ErrBadPath):
		return &refusal{http.StatusBadRequest, "InvalidRequest", err.Error()}
	}
	return nil
}

func (s *Service) put(w http.ResponseWriter, r *http.Request) {
	runner, jti, exp, f := s.authenticate(r, output.MethodPut)
	if f != nil {
		s.refuse(w, r, f, runner)
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxPutBytes))
	if err != nil {
		s.refuse(w, r, &refusal{http.StatusRequestEntityTooLarge, "PayloadTooLarge", fmt.Sprintf("a put is at most %d bytes", MaxPutBytes)}, runner)
		return
	}
	if err := s.cfg.Catalog.ValidateObject("dev.knotless.putRunOutput#input", raw); err != nil {
		s.refuse(w, r, &refusal{http.StatusBadRequest, "InvalidRequest", err.Error()}, runner)
		return
	}
	var in output.PutInput
	if err := json.Unmarshal(raw, &in); err != nil {
		s.refuse(w, r, &refusal{http.StatusBadRequest, "InvalidRequest", err.Error()}, runner)
		return
	}
	if f := owns(runner, in.Check); f != nil {
		s.refuse(w, r, f, runner)
		return
	}
	if f := s.replay.bind(jti, binding{runner: runner, lxm: output.MethodPut, check: in.Check, run: in.Run, exp: exp}); f != nil {
		s.refuse(w, r, f, runner)
		return
	}
	out, err := s.cfg.Store.Put(runner, in)
	if err != nil {
		if f := storeRefusal(err); f != nil {
			s.refuse(w, r, f, runner)
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
	runner, jti, exp, f := s.authenticate(r, output.MethodPutFile)
	if f != nil {
		s.refuse(w, r, f, runner)
		return
	}
	q := r.URL.Query()
	check, run, p := q.Get("check"), q.Get("run"), q.Get("path")
	if f := owns(runner, check); f != nil {
		s.refuse(w, r, f, runner)
		return
	}
	if run == "" || len(run) > 128 {
		s.refuse(w, r, &refusal{http.StatusBadRequest, "InvalidRequest", "run is required (at most 128 bytes)"}, runner)
		return
	}
	if f := s.replay.bind(jti, binding{runner: runner, lxm: output.MethodPutFile, check: check, run: run, exp: exp}); f != nil {
		s.refuse(w, r, f, runner)
		return
	}
	file, err := s.cfg.Store.PutFile(runner, check, run, p, r.Body)
	if err != nil {
		if f := storeRefusal(err); f != nil {
			s.refuse(w, r, f, runner)
			return
		}
		s.cfg.Logger.Error("keep a run file", "check", check, "path", p, "err", err)
		outputhttp.XRPCError(w, http.StatusInternalServerError, "InternalServerError", "keeping the file failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(file)
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
// runner's token is verified once, not at every put.
type replay struct {
	mu     sync.Mutex
	seen   map[string]binding
	ok     map[[32]byte]verifiedToken
	max    int
	now    func() time.Time
	leeway time.Duration
}

type verifiedToken struct {
	lxm, did string
	exp      time.Time
}

// verified reports whether token was verified for lxm and has not
// expired, and whose it is.
func (c *replay) verified(token, lxm string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.ok[sha256.Sum256([]byte(token))]
	if !ok || v.lxm != lxm || !c.now().Before(v.exp.Add(c.leeway)) {
		return "", false
	}
	return v.did, true
}

// remember keeps a verified token until it expires.
func (c *replay) remember(token, lxm, did string, exp time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ok) >= c.max {
		c.purgeLocked()
		if len(c.ok) >= c.max {
			return // verified at every use until room frees
		}
	}
	c.ok[sha256.Sum256([]byte(token))] = verifiedToken{lxm: lxm, did: did, exp: exp}
}

func (c *replay) bind(jti string, b binding) *refusal {
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.seen[jti]; ok {
		if prev.runner == b.runner && prev.lxm == b.lxm && prev.check == b.check && prev.run == b.run {
			return nil
		}
		return &refusal{http.StatusUnauthorized, "TokenReplayed", fmt.Sprintf("the token was used for %s of %s run %s", prev.lxm, prev.check, prev.run)}
	}
	if len(c.seen) >= c.max {
		c.purgeLocked()
		if len(c.seen) >= c.max {
			return &refusal{http.StatusServiceUnavailable, "TooManyTokens", "too many tokens in use; try again when some have expired"}
		}
	}
	c.seen[jti] = b
	return nil
}

// purge forgets the tokens that have expired: they are refused anyway.
func (c *replay) purge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.purgeLocked()
}

func (c *replay) purgeLocked() {
	now := c.now()
	for k, v := range c.seen {
		if now.After(v.exp.Add(c.leeway)) {
			delete(c.seen, k)
		}
	}
	for k, v := range c.ok {
		if now.After(v.exp.Add(c.leeway)) {
			delete(c.ok, k)
		}
	}
}
