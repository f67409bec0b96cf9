// Package live is the daemon's live-output part: each run's masked log
// as a stream (output.Stream) in the runner's hub, read through the
// runner's listener (serve --listen: getRunOutput, subscribeRunOutput,
// getRunFile and the page) and pushed to an output service
// (serve --output-service: putRunOutput, putRunFile) by a goroutine per
// run; the run's output files kept for download, bounded (files.go). It
// is the scheduler's Tap (a stream opened before a run's running check,
// seeded with the log handed over when a run is adopted, ended with the
// run) and the checks part's Live (where a check's output is read, the
// files it lists). See docs/design/live-output.md.
package live

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/output/outputpush"
	"knotless.dev/run/internal/rules/job"
)

// Config is the operator's part of live output.
type Config struct {
	// Listen is where the runner serves its runs' output (--listen);
	// "" serves none.
	Listen string
	// PublicURL is the base URL readers reach the output at, written in
	// each running check (live.service, and live.page under it)
	// (--public-url). Default: Service when set, else http://Listen.
	PublicURL string
	// Service is the output service's URL (--output-service) and
	// ServiceDID its DID (--output-service-did), the audience of the
	// runner's service-auth tokens: each run's output is pushed there.
	Service, ServiceDID string
	// Hub bounds the runs' streams in memory (output.HubConfig's
	// defaults when zero).
	Hub output.HubConfig
	// Files bounds the runs' output files kept (FilesConfig's defaults
	// when zero).
	Files FilesConfig
	// PushGrace is how long a stopping runner waits for the output of
	// its ended runs to reach the service (default 30s).
	PushGrace time.Duration
	// WriteTimeout drops a reader of the listener that takes longer
	// than this to take a write: a piece of an answer, a subscription's
	// frame, a whole page or error (default 30s).
	WriteTimeout time.Duration
}

// Enabled reports whether live output is on: a listener, an output
// service, or both.
func (c Config) Enabled() bool { return c.Listen != "" || c.Service != "" }

// Validate checks the settings, each error naming its flag.
func (c Config) Validate() error {
	if c.Service != "" {
		if err := httpURL(c.Service); err != nil {
			return fmt.Errorf("--output-service %q: %w", c.Service, err)
		}
		if _, err := syntax.ParseDID(c.ServiceDID); err != nil {
			return fmt.Errorf("--output-service-did %q (the output service's DID, the audience of the runner's tokens): %w", c.ServiceDID, err)
		}
	} else if c.ServiceDID != "" {
		return errors.New("--output-service-did without --output-service")
	}
	if c.PublicURL != "" {
		if !c.Enabled() {
			return errors.New("--public-url without --listen or --output-service: no live output to read there")
		}
		if err := httpURL(c.PublicURL); err != nil {
			return fmt.Errorf("--public-url %q: %w", c.PublicURL, err)
		}
	}
	if c.Listen != "" {
		host, _, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return fmt.Errorf("--listen %q: %w", c.Listen, err)
		}
		if ip := net.ParseIP(host); (host == "" || ip != nil && ip.IsUnspecified()) && c.PublicURL == "" && c.Service == "" {
			return fmt.Errorf("--listen %q listens on every address: set --public-url to the URL readers reach it at (it goes in the check records)", c.Listen)
		}
	}
	return nil
}

func httpURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return errors.New("want an http or https base URL")
	}
	return nil
}

// Tokens mints service-auth tokens (pdsclient.Account): the pushes'.
type Tokens = outputpush.TokenSource

// Ports are what live output uses of the outside.
type Ports struct {
	// Tokens mints the service-auth tokens of the pushes.
	Tokens Tokens
	// HTTP is the pusher's client (a default one when nil).
	HTTP *http.Client
}

// Live is the live-output part. Its lock guards the runs it streams.
type Live struct {
	cfg      Config
	runner   syntax.DID
	filesDir string
	p        Ports
	log      *slog.Logger
	hub      *output.Hub
	// Set by Start.
	files  *files
	pusher *outputpush.Pusher
	ln     net.Listener

	mu sync.Mutex
	// runs are the runs streamed here not ended yet, by check key: going,
	// handed over or released at a stop.
	runs    map[string]*liveRun
	pushing map[*liveRun]bool
	stopped bool
	pushes  sync.WaitGroup
}

// liveRun is one run's stream and its push.
type liveRun struct {
	s      *output.Stream
	ended  bool
	cancel context.CancelFunc // its push's; nil: none
}

// New returns the live-output part of runner; the runs' files go under
// filesDir. Start does what can fail.
func New(cfg Config, runner syntax.DID, filesDir string, p Ports, log *slog.Logger) *Live {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.PushGrace <= 0 {
		cfg.PushGrace = 30 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	return &Live{cfg: cfg, runner: runner, filesDir: filesDir, p: p, log: log, hub: output.NewHub(cfg.Hub),
		runs: map[string]*liveRun{}, pushing: map[*liveRun]bool{}}
}

// Start readies live output before the runner is ready: the files'
// directory, the pusher and the listener (a port taken fails the
// start). Off, it does nothing.
func (l *Live) Start() error {
	if !l.cfg.Enabled() {
		return nil
	}
	var err error
	if l.files, err = newFiles(l.cfg.Files, l.filesDir, l.log); err != nil {
		return fmt.Errorf("live output: %w", err)
	}
	if l.cfg.Service != "" {
		l.pusher, err = outputpush.New(outputpush.Config{Service: l.cfg.Service, ServiceDID: l.cfg.ServiceDID, Tokens: l.p.Tokens, HTTP: l.p.HTTP,
			Logger: l.log})
		if err != nil {
			return err
		}
	}
	if l.cfg.Listen != "" {
		if l.ln, err = net.Listen("tcp", l.cfg.Listen); err != nil {
			return fmt.Errorf("--listen %s: %w", l.cfg.Listen, err)
		}
	}
	return nil
}

// Addr is the listener's address (nil without one).
func (l *Live) Addr() net.Addr {
	if l.ln == nil {
		return nil
	}
	return l.ln.Addr()
}

// Serve serves the listener and keeps the hub's clock until stop, which
// a stopping daemon calls once its runs have ended or been handed over
// (and the state saved): the pushes of the runs that ended get
// PushGrace to reach the service, those of runs going on in a successor
// stop at once (the successor's push goes on from what the service
// has); then the listener closes, its subscribers with it.
func (l *Live) Serve() (stop func()) {
	if !l.cfg.Enabled() {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.hub.Run(ctx) })
	var srv *http.Server
	if l.ln != nil {
		h, err := outputhttp.New(outputhttp.Config{Source: l.hub, Files: l.files, Logger: l.log, WriteTimeout: l.cfg.WriteTimeout})
		if err != nil {
			l.log.Error("live output: the listener serves nothing", "err", err)
		} else {
			srv = &http.Server{
				Handler:           h,
				ReadHeaderTimeout: 10 * time.Second,
				// Every request is a GET without a body. A subscription's
				// hijacked connection keeps none of the server's
				// deadlines: its frames have their own.
				ReadTimeout: 30 * time.Second,
				// For a page, an error: getRunOutput and getRunFile move
				// the deadline on at each write (outputhttp), so a slow
				// reader is not dropped, a stalled one is; the answers in
				// flight and each address's are bounded there too.
				WriteTimeout:   l.cfg.WriteTimeout,
				IdleTimeout:    2 * time.Minute,
				MaxHeaderBytes: 64 << 10,
				BaseContext:    func(net.Listener) context.Context { return ctx },
			}
			l.log.Info("serving live output", "listen", l.ln.Addr().String(), "public_url", l.public())
			wg.Go(func() {
				if err := srv.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					l.log.Error("live output: the listener stopped", "listen", l.ln.Addr().String(), "err", err)
				}
			})
		}
	}
	return sync.OnceFunc(func() {
		l.stopPushes()
		cancel()
		if srv != nil {
			_ = srv.Close()
		} else if l.ln != nil {
			_ = l.ln.Close()
		}
		wg.Wait()
	})
}

// stopPushes ends the pushes: those of runs not ended here at once,
// those of ended runs after PushGrace at most.
func (l *Live) stopPushes() {
	l.mu.Lock()
	l.stopped = true
	for r := range l.pushing {
		if !r.ended {
			r.cancel()
		}
	}
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.pushes.Wait(); close(done) }()
	t := time.NewTimer(l.cfg.PushGrace)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	l.mu.Lock()
	n := len(l.pushing)
	for r := range l.pushing {
		r.cancel()
	}
	l.mu.Unlock()
	l.log.Warn("stopping: output of ended runs not all pushed to the output service; their checks' logs have it", "runs", n, "grace", l.cfg.PushGrace)
	<-done
}

// public is the base URL written in the running checks: --public-url,
// else the output service's, else the listener's address.
func (l *Live) public() string {
	switch {
	case l.cfg.PublicURL != "":
		return l.cfg.PublicURL
	case l.cfg.Service != "":
		return l.cfg.Service
	case l.ln != nil:
		return "http://" + l.ln.Addr().String()
	default:
		return "http://" + l.cfg.Listen
	}
}

// check is the AT-URI of the runner's check key.
func (l *Live) check(key string) string {
	return "at://" + l.runner.String() + "/" + forge.CollectionCheck + "/" + key
}

// Open opens the stream of j's run runID (scheduler.Tap), before its
// running check is written, and starts its push; an adopted run's
// stream is seeded with the log handed over (prior, at h.LogSize). A
// run whose stream is refused (the hub's bound on live runs) goes on
// without live output (nil).
func (l *Live) Open(j *job.Job, runID string, prior []byte, h *run.Handover) io.Writer {
	if !l.cfg.Enabled() {
		return nil
	}
	log := l.log.With("check", j.Key, "run", runID)
	s, err := l.hub.Open(l.check(j.Key), runID)
	if err != nil {
		log.Warn("the run goes on without live output", "err", err)
		return nil
	}
	if h != nil {
		if err := s.Seed(prior, h.LogSize); err != nil {
			log.Warn("the adopted run goes on without live output", "err", err)
			s.End("")
			return nil
		}
	}
	r := &liveRun{s: s}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs[j.Key] = r
	if l.pusher != nil && !l.stopped {
		ctx, cancel := context.WithCancel(context.Background())
		r.cancel = cancel
		l.pushing[r] = true
		l.pushes.Go(func() { l.push(ctx, r, log) })
	}
	return s
}

// Ended ends the stream of a run that ended here with its status
// (scheduler.Tap), after keeping its output files: its push then sends
// the rest and the files.
func (l *Live) Ended(j *job.Job, runID string, res *run.Result, outDir string) {
	l.mu.Lock()
	r, ok := l.runs[j.Key]
	l.mu.Unlock()
	if !ok || r.s.Run() != runID || l.files == nil {
		return
	}
	l.files.keep(r.s.Check(), runID, outDir, res.Artifacts, res.Mask)
	r.s.End(string(res.Status))
	l.mu.Lock()
	r.ended = true
	if l.runs[j.Key] == r {
		delete(l.runs, j.Key)
	}
	l.mu.Unlock()
}

// Where says where check key's output is read (checks.Live): nowhere
// when no stream of it is open here.
func (l *Live) Where(key string) *forge.LiveOutput {
	l.mu.Lock()
	_, ok := l.runs[key]
	l.mu.Unlock()
	if !ok {
		return nil
	}
	base := strings.TrimSuffix(l.public(), "/")
	return &forge.LiveOutput{Service: base, Page: base + "/runs/" + l.runner.String() + "/" + key}
}

// Files lists the output files kept of check key's run (checks.Live).
func (l *Live) Files(key string) []forge.RunFile {
	if l.files == nil {
		return nil
	}
	var out []forge.RunFile
	for _, f := range l.files.Files(l.check(key)) {
		out = append(out, forge.RunFile{Path: f.Path, Size: f.Size})
	}
	return out
}

// push sends r's stream to the output service until it has all of it,
// then the run's files; it stops when its context does (a stopping
// runner), or when the service refuses the run for good.
func (l *Live) push(ctx context.Context, r *liveRun, log *slog.Logger) {
	defer func() {
		l.mu.Lock()
		delete(l.pushing, r)
		l.mu.Unlock()
		r.cancel()
	}()
	check, runID := r.s.Check(), r.s.Run()
	if err := l.pusher.Push(ctx, r.s); err != nil {
		if ctx.Err() == nil {
			log.Warn("pushing the run's output to the output service stopped", "service", l.cfg.Service, "err", err)
		}
		return
	}
	for _, f := range l.files.runFiles(check, runID) {
		rc, _, err := l.files.OpenFile(check, f.Path)
		if err == nil {
			_, err = l.pusher.PutFile(ctx, check, runID, f.Path, rc)
			rc.Close()
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Warn("output file not pushed to the output service", "path", f.Path, "err", err)
		}
	}
}

// FilesDir is where a runner with state in cacheDir keeps its runs'
// output files.
func FilesDir(cacheDir string) string { return filepath.Join(cacheDir, "run-files") }
