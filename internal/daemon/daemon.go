// Package daemon is the runner daemon's composition root: it logs the
// runner in, loads its state, sweeps orphaned sessions, reconciles the
// work on atproto, runs it through a bounded queue, writes check records
// at each state change, and on SIGTERM hands over to its successor. It
// owns every goroutine it starts and waits for them.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/checks"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/run"
	"knotless.dev/run/internal/state"
	"knotless.dev/run/internal/workflow"
)

// Config configures the daemon. The cli fills it from flags, the config
// file and credential files; nothing here reads the environment.
type Config struct {
	// Runner is the runner's DID; PDS its PDS URL (default: from its DID
	// document).
	Runner syntax.DID
	PDS    string
	// Password is the app password (read from a file by the caller).
	Password string
	// Directory resolves DIDs (PLC URL configured by the caller).
	Directory identity.Directory
	HTTP      *http.Client

	Targets  []ingest.Target
	Discover bool
	Pulls    bool
	// Relay, when set, is where events and discovery come from instead
	// of the owners' PDSes.
	Relay string
	// Firehose follows com.atproto.sync.subscribeRepos; without it the
	// daemon reconciles every Poll only.
	Firehose bool
	Poll     time.Duration

	// Queue makes the runner land the merge queue of the repositories
	// whose lander it is (lander.go); PushCredentials are the keys and
	// tokens its git push to their sources uses, each offered only to
	// the host (and path prefix) it is bound to (none: the push offers
	// nothing).
	Queue           bool
	PushCredentials mirror.PushCredentials
	// QueueBatch is the most pulls one batch takes (0:
	// DefaultQueueBatch): a long queue lands in several batches, each a
	// merge and a run of bounded size.
	QueueBatch int

	Executor     executor.Executor
	DefaultImage string
	Concurrency  int
	StopWait     time.Duration
	StateDir     string
	CacheDir     string
	// Caches is the store of workflow caches (nil: runs keep none).
	Caches run.Caches

	// Max bounds what a workflow may ask for: untrusted runs, or all
	// (run.Maximums).
	Max run.Maximums
	// Caps bound floods (flood.go): Caps.WorkflowsPerEvent the
	// workflows one push or pull may run (one with more gets one error
	// check and runs none); the author caps the events of one pull's
	// author (and, with Max.All, of one repository owner's pushes): its
	// runs queued or running at once, and the check writes its events
	// cause per Caps.Window (an hour by default, refilled continuously).
	// An event over an author cap waits, without a check, until runs
	// end or the budget refills.
	Caps Caps
	// Listing bounds the reconcile's listings of other accounts' PDSes
	// (zero fields: the defaults).
	Listing Listing

	// Secrets are the operator's secrets, each with the repositories
	// (and optionally workflows and refs) it is for; one that applies to
	// a run takes precedence over a sealed record of the same name. With
	// Discover, none may be for every repository.
	Secrets []OperatorSecret

	// Git is what git sources the mirrors may fetch from (https only by
	// default), git's deadline and the workflow and checkout limits. The
	// state and cache directories are always forbidden as local sources.
	Git mirror.Options

	// Checkout and Outputs bound each run's transfers (run.Config).
	Checkout, Outputs run.Bound

	// Notify sends one sd_notify message (nil: not under systemd).
	Notify func(state string)
	// OnCheck, when set, is told of every check record written, after the
	// write (tests and metrics).
	OnCheck func(key string, c forge.Check)
	// Watchdog is systemd's WatchdogSec (0: off).
	Watchdog time.Duration
	Logger   *slog.Logger

	// Retry paces what is tried again after a failure that is not the
	// work's; Retention is how long final work is remembered (owed.go).
	Retry     Retry
	Retention time.Duration
}

func (c *Config) defaults() {
	if c.Concurrency < 1 {
		c.Concurrency = 1
	}
	c.Caps.defaults()
	if c.Poll == 0 {
		c.Poll = 5 * time.Minute
	}
	if c.Notify == nil {
		c.Notify = func(string) {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: 2 * time.Minute}
	}
	c.Retry.defaults()
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
}

// Daemon is one running runner process.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	cat     *forge.Catalog
	reader  *forge.Reader
	account *forge.Account
	key     *forge.KeyPair
	mirrors mirrorSet
	engine  *run.Engine
	rec     *checks.Recorder // the only writer of check records
	budget  *writeBudget     // the authors' check writes (flood.go); its own lock
	lister  intake
	blobs   blobStore     // takes logs and outputs: the account
	sealed  sealedSecrets // the owners' sealed secrets: the reader
	queue   queueRecords  // the merge queue's records: reader and account

	wake chan struct{} // a hint that records changed: reconcile soon
	// warned holds the workflow warnings already logged (warnUnacted).
	warned sync.Map
	// detach is closed on SIGTERM to hand started runs over; nil when the
	// executor cannot resume sessions (they then finish within StopWait).
	detach chan struct{}
	// adopted are the runs an earlier process handed over, taken up
	// before READY=1.
	adopted []*job

	mu sync.Mutex
	st *state.State
	sf stateFile // the one writer of state.json (statefile.go)
	q  *queue    // the work in hand (queue.go)
	// hosts are the PDSes of the watched repositories' owners.
	hosts        []string
	cursorsDirty bool
	detached     int    // runs handed over by detaching
	faults       faults // what failed and when to try again (owed.go)
}

// ErrStateCorrupt wraps a state file that stops the start.
var ErrStateCorrupt = errors.New("state unusable")

// Run runs the daemon until ctx ends, then hands over and returns.
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	if err := checkOperatorSecrets(cfg.Secrets, cfg.Discover); err != nil {
		return err
	}
	d := &Daemon{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "daemon"),
		wake:   make(chan struct{}, 1),
		q:      newQueue(),
		budget: newWriteBudget(cfg.Caps.CheckWritesPerAuthor, cfg.Caps.Window),
	}
	if _, ok := cfg.Executor.(executor.Resumer); ok {
		d.detach = make(chan struct{})
	}
	d.cfg.HTTP = d.faults.init(d.cfg.HTTP)
	if err := d.start(ctx); err != nil {
		return err
	}
	return d.serve(ctx)
}

// start does everything READY=1 waits for: state, key, login, the
// executor's orphan sweep and the runner's known checks.
func (d *Daemon) start(ctx context.Context) error {
	cfg := d.cfg
	for _, dir := range []string{cfg.StateDir, cfg.CacheDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	st, err := state.Load(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStateCorrupt, err)
	}
	d.st = st
	d.sf.dir = cfg.StateDir
	key, created, err := state.LoadKey(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStateCorrupt, err)
	}
	d.key = key
	if created {
		d.log.Info("made a sealing key pair", "file", filepath.Join(cfg.StateDir, state.KeyFile), "public", key.PublicString())
	}
	if d.cat, err = forge.NewCatalog(); err != nil {
		return err
	}
	d.reader = &forge.Reader{Dir: cfg.Directory, Catalog: d.cat, HTTP: cfg.HTTP, Limits: cfg.Listing.Limits}
	host := cfg.PDS
	if host == "" {
		if host, err = d.reader.PDS(ctx, cfg.Runner); err != nil {
			return fmt.Errorf("find the runner's PDS: %w", err)
		}
	}
	acct, resumed, err := forge.Login(ctx, forge.LoginConfig{
		Host:       host,
		Identifier: cfg.Runner.String(),
		Password:   cfg.Password,
		Session:    st.Session,
		OnSession:  d.saveSession,
		HTTP:       cfg.HTTP,
	}, d.cat)
	if err != nil {
		return err
	}
	if acct.DID() != cfg.Runner {
		return fmt.Errorf("log in: the PDS says this account is %s, not the runner %s", acct.DID(), cfg.Runner)
	}
	d.account, d.blobs = acct, acct
	d.rec = checks.NewRecorder(acct, d.noteCheck)
	d.log.Info("logged in", "did", acct.DID().String(), "pds", acct.Host(), "resumed_session", resumed)

	gitOpts := cfg.Git
	gitOpts.Forbidden = append([]string{cfg.StateDir, cfg.CacheDir}, gitOpts.Forbidden...)
	ms, err := mirror.New(filepath.Join(cfg.CacheDir, "mirrors"), gitOpts)
	if err != nil {
		return err
	}
	d.mirrors, d.sealed, d.queue = mirrors{ms}, secretReader{d.reader}, queueForge{d.reader, acct}
	d.engine = run.New(run.Config{
		Executor:     cfg.Executor,
		Logger:       cfg.Logger.With("component", "run"),
		Runner:       cfg.Runner.String(),
		DefaultImage: cfg.DefaultImage,
		Max:          cfg.Max,
		Checkout:     cfg.Checkout,
		Outputs:      cfg.Outputs,
		Caches:       cfg.Caches,
	})
	discover := []string{acct.Host()}
	if cfg.Relay != "" {
		discover = []string{cfg.Relay}
	}
	d.lister = &ingest.Lister{
		Reader: d.reader, Dir: cfg.Directory, Runner: cfg.Runner, Targets: cfg.Targets,
		Discover: cfg.Discover, DiscoverHosts: discover, Pulls: cfg.Pulls, Bounds: cfg.Listing.Bounds,
		Logger: cfg.Logger.With("component", "ingest"),
	}

	d.adopted = d.adoptable(ctx)
	if err := d.sweep(ctx, d.adopted); err != nil {
		// Not a reason to exit (a crash loop tells no one why): start
		// degraded, try again with backoff (degraded.go).
		d.degrade(fmt.Errorf("sweep orphaned sessions: %w", err))
	} else {
		d.faults.swept = true
	}
	listed, bad, err := forge.ListOwn[forge.Check](ctx, acct, forge.CollectionCheck)
	if err != nil {
		return fmt.Errorf("list the runner's checks: %w", err)
	}
	for _, b := range bad {
		d.log.Warn("check record does not match its lexicon; ignored", "uri", b.URI.String(), "err", b.Err)
	}
	for _, c := range listed {
		d.rec.Know(c.URI.RecordKey().String(), c.Value)
	}
	d.loadOwed()
	return nil
}

// adoptable returns, as jobs, the runs an earlier process handed over
// that this executor can take up again and whose sessions are still
// there (toAdopt). The other runs it left (killed mid-run, gone, or on
// an executor that cannot resume) are not final: the
// reconciliation runs them again under the same check key.
func (d *Daemon) adoptable(ctx context.Context) []*job {
	if d.detach == nil {
		return nil
	}
	var jobs []*job
	for _, key := range d.toAdopt(ctx) {
		r := d.st.Runs[key]
		j, err := d.rebuild(ctx, key, r)
		if err != nil {
			d.log.Warn("cannot adopt a handed-over run; its work runs again", "check", key, "run", r.RunID, "err", err)
			continue
		}
		jobs = append(jobs, j)
	}
	if err := d.claim(jobs); err != nil {
		d.log.Error("record the adopted runs as taken; a crash before they end would adopt them again from their old handover", "err", err)
	}
	return jobs
}

// rebuild makes the job of a handed-over run from what state.json and
// the run's directory keep.
func (d *Daemon) rebuild(ctx context.Context, key string, r state.Run) (*job, error) {
	var saved savedJob
	if err := json.Unmarshal(r.Job, &saved); err != nil {
		return nil, fmt.Errorf("decode job: %w", err)
	}
	repo, err := d.mirrors.Open(ctx, mirrorKey(saved.Event))
	if err != nil {
		return nil, err
	}
	wfs, _, err := repo.Workflows(ctx, saved.Tree)
	if err != nil {
		return nil, err
	}
	var wf *workflow.Workflow
	for _, w := range wfs {
		if w.Name == r.Workflow {
			wf = w
		}
	}
	if wf == nil {
		return nil, fmt.Errorf("workflow %s not found at %s", r.Workflow, saved.Tree)
	}
	prior, err := os.ReadFile(filepath.Join(d.runDir(r.RunID), handoverLog))
	if err != nil {
		return nil, fmt.Errorf("read the run's log so far: %w", err)
	}
	return &job{key: key, ev: saved.Event, wf: wf, repo: repo, tree: saved.Tree, runID: r.RunID, check: saved.Check,
		adopt: r.Handover, prior: prior}, nil
}

// sweep removes the sessions no run owns any more: all but those of the
// runs to adopt. The other runs an earlier process left are forgotten
// here; their checks are not final, so reconciliation runs them again.
func (d *Daemon) sweep(ctx context.Context, adopt []*job) error {
	keep := make([]string, 0, len(adopt))
	runs := map[string]state.Run{}
	for _, j := range adopt {
		keep = append(keep, j.runID)
		runs[j.key] = d.st.Runs[j.key]
	}
	removed, err := d.cfg.Executor.Sweep(ctx, keep)
	if err != nil {
		return fmt.Errorf("sweep orphaned sessions: %w", err)
	}
	for _, r := range removed {
		d.log.Info("swept orphaned session", "session", r.String())
	}
	if left := len(d.st.Runs) - len(runs); left > 0 {
		d.log.Info("runs of an earlier process will run again", "runs", left)
		d.st.Runs = runs
		if err := d.saveState(); err != nil {
			return err
		}
	}
	return nil
}

func (d *Daemon) saveSession(s forge.Session) {
	d.mu.Lock()
	if d.st == nil {
		d.mu.Unlock()
		return
	}
	c := s
	d.st.Session = &c
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	if err := d.sf.write(snap); err != nil {
		d.log.Error("save session", "err", err)
	}
}

// saveState writes state.json (stateFile); the caller holds no lock.
func (d *Daemon) saveState() error {
	d.mu.Lock()
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	return d.sf.write(snap)
}

// serve is the daemon's life after start: workers, reconciliation, the
// event sources, status and the watchdog, then the handover.
func (d *Daemon) serve(ctx context.Context) error {
	runCtx, stopRuns := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRuns()
	var workers sync.WaitGroup
	for range d.cfg.Concurrency {
		workers.Go(func() { d.worker(ctx, runCtx) })
	}
	var aux sync.WaitGroup
	auxCtx, stopAux := context.WithCancel(ctx)
	if d.cfg.Watchdog > 0 {
		aux.Go(func() { d.watchdog(auxCtx) })
	}
	if d.cfg.Firehose {
		aux.Go(func() { d.follow(auxCtx) })
	}
	aux.Go(func() { d.payOwed(auxCtx) })
	aux.Go(func() { d.watchExecutor(auxCtx) })

	for _, j := range d.adopted {
		jctx, cancel := context.WithCancel(runCtx)
		j.cancel = cancel
		d.mu.Lock()
		d.q.start(j)
		d.mu.Unlock()
		workers.Go(func() {
			d.runJob(jctx, j)
			d.jobEnded(j)
		})
	}
	if len(d.adopted) > 0 {
		d.log.Info(fmt.Sprintf("adopted %d runs", len(d.adopted)), "runs", len(d.adopted))
	}

	d.cfg.Notify("READY=1")
	d.log.Info("ready", "executor", d.cfg.Executor.Name(), "concurrency", d.cfg.Concurrency, "repos", len(d.cfg.Targets), "discover", d.cfg.Discover, "pulls", d.cfg.Pulls)
	d.status()

	d.loop(ctx)

	stopAux()
	aux.Wait()
	d.handover(&workers, stopRuns)
	return nil
}

// loop reconciles at start, on every hint and every Poll, until ctx ends.
func (d *Daemon) loop(ctx context.Context) {
	tick := time.NewTicker(d.cfg.Poll)
	defer tick.Stop()
	for {
		if err := d.reconcile(ctx); err != nil && ctx.Err() == nil {
			d.log.Error("reconcile", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-d.wake:
		}
	}
}

// Wake asks for a reconcile soon.
func (d *Daemon) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *Daemon) watchdog(ctx context.Context) {
	t := time.NewTicker(d.cfg.Watchdog / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.cfg.Notify("WATCHDOG=1")
		}
	}
}

// status tells systemd how many runs are going and waiting.
func (d *Daemon) status() {
	d.mu.Lock()
	going, queued, draining := len(d.q.running), len(d.q.waiting), d.q.draining
	degraded := d.degradedStatusLocked()
	d.mu.Unlock()
	msg := fmt.Sprintf("STATUS=%d running, %d queued%s", going, queued, degraded)
	if draining {
		msg = fmt.Sprintf("STATUS=stopping: %d running", going)
	}
	d.cfg.Notify(msg)
}

// handover ends the process's work on SIGTERM: nothing new is claimed,
// queued runs are released (their checks stay queued: the successor's
// work), and started runs are detached for the successor to adopt (an
// executor that resumes sessions) or get StopWait to finish; what is
// still going then is cancelled and released the same way.
func (d *Daemon) handover(workers *sync.WaitGroup, stopRuns context.CancelFunc) {
	d.cfg.Notify("STOPPING=1")
	d.mu.Lock()
	released, going := d.q.drain()
	d.mu.Unlock()
	d.status()
	d.log.Info("stopping: claiming nothing new", "released_queued", released, "running", going, "stop_wait", d.cfg.StopWait)
	if d.detach != nil {
		// The executor resumes sessions: started runs go on in their
		// sessions and the successor adopts them.
		close(d.detach)
	}

	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	deadline := time.NewTimer(d.cfg.StopWait)
	defer deadline.Stop()
	extend := time.NewTicker(5 * time.Second)
	defer extend.Stop()
	d.extendTimeout()
	for {
		select {
		case <-done:
			d.finishHandover(released, 0)
			return
		case <-extend.C:
			d.extendTimeout()
			d.status()
		case <-deadline.C:
			d.mu.Lock()
			left := d.q.releaseRunning()
			d.mu.Unlock()
			d.log.Warn("stop wait over: cancelling the runs still going; their checks are released to the successor", "runs", left)
			stopRuns()
			<-done
			d.finishHandover(released, left)
			return
		}
	}
}

func (d *Daemon) extendTimeout() {
	usec := (d.cfg.StopWait + 30*time.Second).Microseconds()
	d.cfg.Notify(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", usec))
}

func (d *Daemon) finishHandover(released, cancelled int) {
	if err := d.saveState(); err != nil {
		d.log.Error("save state", "err", err)
	}
	d.mu.Lock()
	detached := d.detached
	d.mu.Unlock()
	d.log.Info(fmt.Sprintf("handed over %d runs", released+cancelled+detached), "queued", released, "going_on", detached, "cancelled_at_stop_wait", cancelled)
}
