// Package daemon is the runner daemon's composition root: it logs the
// runner in, loads its state, sweeps orphaned sessions and adopts the
// runs its predecessor handed over, wires the parts (intake, run
// control, the scheduler, the lander, the checks part and the state
// store), runs
// their goroutines and waits for them, tells systemd how it is (READY,
// STATUS, the watchdog), watches the executor's health, and on SIGTERM
// hands over to its successor. The rules are the parts'; none is here.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/kube/replicas"
	"knotless.dev/run/internal/lib/backoff"
	"knotless.dev/run/internal/lib/idlemem"
	"knotless.dev/run/internal/lib/version"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/observe/readiness"
	"knotless.dev/run/internal/observe/status"
	"knotless.dev/run/internal/observe/telemetry"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/lander"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/parts/runctl"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
)

// Daemon is one running runner process: its parts, wired.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	out    outside
	caps   executor.Capabilities // asked of the executor once, at start
	store  *state.Store
	keeper *checks.Keeper
	intake *intake.Intake
	sched  *scheduler.Scheduler
	lander *lander.Lander // nil without --queue
	runctl *runctl.Part   // run control
	live   *live.Live     // live output
	health health         // the executor's (health.go); its own lock
	tel    *telemetry.Status
	// cleaner removes the runs' sessions after their verdicts; the
	// handover waits for it.
	cleaner *run.Cleaner
	// memory returns what the runs freed once the daemon is idle.
	memory *idlemem.Releaser
	// replicas is this process's place among the runner's replicas;
	// nil for one process.
	replicas Replicas
}

// outside is the part of the world each part reaches through its
// ports: start fills it with the real ones, the -short rig with
// in-memory ones (internal/parts/rig).
type outside struct {
	lister  intake.Lister
	mirrors job.Mirrors
	// landerMirrors are mirrors whose pushes offer the push credentials.
	landerMirrors job.Mirrors
	blobs         checks.Blobs
	sealed        scheduler.Sealed
	key           scheduler.Opener
	records       lander.Records
	checks        checks.Writer
	tokens        live.Tokens // the runner's service-auth tokens, for live output's pushes
	// ownChecks lists the runner's check records (what is final is never
	// run again).
	ownChecks func(ctx context.Context) ([]forge.Record[forge.Check], []forge.Invalid, error)
	// stream follows the event stream of a host from a cursor.
	stream func(host string, cursor int64) ingest.Source
	// limitedUntil is until when the runner's PDS said it limits it;
	// budgetLow whether it said little is left of its write budget.
	limitedUntil func() time.Time
	budgetLow    func() bool
}

// ErrStateCorrupt wraps a state file that stops the start.
var ErrStateCorrupt = errors.New("state unusable")

// Run runs the daemon until ctx ends, then hands over and returns.
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	// One live process owns a state directory, and on this host a
	// runner of an executor of this host (lock.go). Taken before
	// anything is read; let go last, after the handover's final save
	// and the status socket's removal, so the successor (started once
	// this process has ended: systemd's restart, a StatefulSet's pod)
	// finds it free.
	locks, err := takeLocks(cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := locks.release(); err != nil {
			cfg.Logger.Warn("let the locks go", "component", "daemon", "err", err)
		}
	}()
	// A replica joins the others once the state directory is its own:
	// a process refused there never takes a replica's name.
	var d *Daemon
	var reps Replicas
	if cfg.Replicas != nil {
		if reps, err = cfg.Replicas(ctx, func() { d.replicasChanged() }); err != nil {
			err = fmt.Errorf("serve --replicas: %w", err)
			if errors.Is(err, replicas.ErrNameHeld) {
				// Another live process has the name: a restart is
				// refused the same way.
				return InUseError{err}
			}
			return err
		}
	}
	store, out, err := open(ctx, &cfg)
	if err != nil {
		return err
	}
	d = wire(cfg, store, out, reps)
	srv, err := telemetry.Listen(cfg.StateDir, cfg.Telemetry.Listen, cfg.Telemetry.Metrics, d.tel, d.log)
	if err != nil {
		return err
	}
	defer srv.Close()
	if err := d.begin(ctx); err != nil {
		return err
	}
	return d.serve(ctx)
}

// open does what the parts need before they exist: the state and cache
// directories, state.json, the sealing key, the login (every session
// refresh saved), the mirrors, and the clients of the outside.
func open(ctx context.Context, cfg *Config) (*state.Store, outside, error) {
	log := cfg.Logger.With("component", "daemon")
	var out outside
	for _, dir := range []string{cfg.StateDir, cfg.CacheDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, out, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	store, err := state.Open(cfg.StateDir)
	if err != nil {
		return nil, out, fmt.Errorf("%w: %w", ErrStateCorrupt, err)
	}
	key, created, err := state.LoadKey(cfg.StateDir)
	if err != nil {
		return nil, out, fmt.Errorf("%w: %w", ErrStateCorrupt, err)
	}
	if created {
		log.Info("made a sealing key pair", "file", filepath.Join(cfg.StateDir, state.KeyFile), "public", key.PublicString())
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		return nil, out, err
	}
	limits := checks.NewRateLimits()
	limits.OnBudget(cfg.Telemetry.Metrics.WriteBudget)
	cfg.Account.HTTP = limits.Client(cfg.Account.HTTP)
	a := cfg.Account
	reader := &pdsclient.Reader{Dir: a.Directory, Catalog: cat, HTTP: a.HTTP, Limits: cfg.Sources.Listing.Limits}
	host := a.PDS
	if host == "" {
		if host, err = reader.PDS(ctx, a.Runner); err != nil {
			return nil, out, fmt.Errorf("find the runner's PDS: %w", err)
		}
	}
	acct, resumed, err := pdsclient.Login(ctx, pdsclient.LoginConfig{
		Host:       host,
		Identifier: a.Runner.String(),
		Password:   a.Password,
		Session:    store.Session(),
		OnSession: func(s forge.Session) {
			if err := store.SetSession(s); err != nil {
				log.Error("save session", "err", err)
			}
		},
		HTTP: a.HTTP,
	}, cat)
	if err != nil {
		return nil, out, err
	}
	if acct.DID() != a.Runner {
		return nil, out, fmt.Errorf("log in: the PDS says this account is %s, not the runner %s", acct.DID(), a.Runner)
	}
	log.Info("logged in", "did", acct.DID().String(), "pds", acct.Host(), "resumed_session", resumed)

	gitOpts := cfg.Git
	gitOpts.Forbidden = append([]string{cfg.StateDir, cfg.CacheDir}, gitOpts.Forbidden...)
	ms, err := mirror.New(filepath.Join(cfg.CacheDir, "mirrors"), gitOpts)
	if err != nil {
		return nil, out, err
	}
	log.Info("git mirrors ready", "dir", filepath.Join(cfg.CacheDir, "mirrors"), "git", ms.GitVersion())
	discover := []string{acct.Host()}
	if cfg.Sources.Relay != "" {
		discover = []string{cfg.Sources.Relay}
	}
	s := cfg.Sources
	out = outside{
		lister: &ingest.Lister{Reader: reader, Dir: a.Directory, Runner: a.Runner, Targets: s.Targets, Discover: s.Discover,
			DiscoverHosts: discover, Pulls: s.Pulls, Bounds: s.Listing.Bounds, Retention: cfg.Intake.WithDefaults().Retention,
			Logger: cfg.Logger.With("component", "ingest")},
		mirrors: ms.Port(nil), landerMirrors: ms.Port(cfg.PushCredentials), blobs: acct, sealed: reader, key: key,
		records: pdsclient.Queue{Reader: reader, Account: acct}, checks: acct, tokens: acct,
		ownChecks: func(ctx context.Context) ([]forge.Record[forge.Check], []forge.Invalid, error) {
			return pdsclient.ListOwn[forge.Check](ctx, acct, forge.CollectionCheck)
		},
		stream: func(host string, cursor int64) ingest.Source {
			return &ingest.Firehose{Host: host, Cursor: cursor, Dir: a.Directory, Logger: cfg.Logger.With("component", "ingest")}
		},
		limitedUntil: func() time.Time { return limits.Until(acct.Host()) },
		budgetLow:    func() bool { return limits.Low(acct.Host()) },
	}
	return store, out, nil
}

// wire makes the parts and joins their ports.
func wire(cfg Config, store *state.Store, out outside, reps Replicas) *Daemon {
	d := &Daemon{cfg: cfg, log: cfg.Logger.With("component", "daemon"), out: out, store: store, replicas: reps}
	logOf := func(part string) *slog.Logger { return cfg.Logger.With("component", part) }
	retry := backoff.Policy{First: cfg.Retry.Backoff, Max: cfg.Retry.MaxBackoff}
	runner := cfg.Account.Runner

	// Every check written is counted against its author's budget, then
	// told to OnCheck.
	m := cfg.Telemetry.Metrics
	rec := checks.NewRecorder(telemetry.NewWriter(out.checks, m), func(key string, c forge.Check) {
		m.CheckWritten(c.Status)
		d.intake.NoteCheck(key, c)
		if cfg.OnCheck != nil {
			cfg.OnCheck(key, c)
		}
	})
	d.live = live.New(cfg.Live, runner, live.FilesDir(cfg.CacheDir), live.Ports{Tokens: out.tokens}, logOf("live"))
	d.keeper = checks.NewKeeper(rec, checks.Ports{Blobs: out.blobs, Outbox: telemetry.Outbox{Outbox: store, M: m}, LimitedUntil: out.limitedUntil,
		BudgetLow: out.budgetLow, LogBlobs: cfg.LogBlobs, Live: d.live}, retry, d.log)
	d.keeper.OnWait(m.RateLimitWaited)
	rec.OnSwapLost(m.SwapLost)
	observe := telemetry.Parts{M: m, Executor: cfg.Engine.Executor.Name()}

	eng := cfg.Engine
	eng.Logger, eng.Runner = logOf("run"), runner.String()
	if eng.Cleaner == nil {
		// The verdict before the clean-up: a run's check is written as
		// soon as its Result is, and its session removed after.
		eng.Cleaner = run.NewCleaner(eng.Logger)
	}
	d.cleaner = eng.Cleaner
	engine := run.New(eng)
	d.caps = engine.Capabilities()
	d.memory = idlemem.New(func() bool {
		going, queued, _ := d.sched.Counts()
		return going == 0 && queued == 0
	}, d.log)
	d.sched = scheduler.New(cfg.Scheduler,
		scheduler.Facts{Runner: runner, Executor: d.caps, ExecutorName: cfg.Engine.Executor.Name(),
			RunsDir: filepath.Join(cfg.CacheDir, "runs"), LimitsAll: cfg.Engine.Max.All},
		scheduler.Ports{Engine: engine, Checks: d.keeper, State: store, Mirrors: out.mirrors, Sealed: out.sealed, Key: out.key,
			Sweeper: cfg.Engine.Executor, Down: d.executorDown, Wake: func() { d.intake.Wake() }, Changed: d.status, Tap: d.live, Observer: observe,
			StopForeign: cfg.StopForeign, Drivers: drivers(reps)},
		d.log)

	var landing intake.Lander
	if cfg.Lander.Queue {
		d.lander = lander.New(cfg.Lander, runner,
			lander.Ports{Records: out.records, Mirrors: out.landerMirrors, Intake: viaIntake{d}, Checks: d.keeper, State: store,
				Wake: func() { d.intake.Wake() }, Observer: observe},
			logOf("lander"))
		landing = d.lander
	}
	d.runctl = runctl.New(runctl.Config{Retention: cfg.Intake.WithDefaults().Retention, Remembered: cfg.Intake.Remembered}, runner,
		runctl.Ports{Scheduler: d.sched, Checks: d.keeper, State: store, Mirrors: out.mirrors, Intake: viaIntake{d}, Observer: observe},
		logOf("runctl"))
	ports := intake.Ports{Lister: out.lister, Mirrors: out.mirrors, Scheduler: d.sched, Checks: d.keeper, State: store, Control: d.runctl,
		Lander: landing, Stream: out.stream, Changed: d.status, Observer: observe}
	if d.caps.Images != nil {
		ports.CheckImage = d.caps.Images.CheckImage
	}
	if reps != nil {
		ports.Mine = reps.Mine
	}
	d.intake = intake.New(cfg.Intake, intake.Facts{Runner: runner, Relay: cfg.Sources.Relay, LimitsAll: cfg.Engine.Max.All,
		DefaultImage: cfg.Engine.DefaultImage}, ports, d.log)
	d.tel = &telemetry.Status{Daemon: status.Daemon{PID: os.Getpid(), Version: version.Version, Started: time.Now().UTC(),
		Executor: observe.Executor, Runner: runner.String()}, Work: d.sched.Work, Counts: d.sched.Counts, Owed: store.Owed, Down: d.executorDown,
		Credentials: cfg.Telemetry.Credentials}
	if reps != nil {
		d.tel.Replicas = d.replicaStatus
		m.SetReplicasLive(len(reps.Members()))
	}
	return d
}

// drivers is reps as the scheduler's Drivers; nil for one process.
func drivers(reps Replicas) scheduler.Drivers {
	if reps == nil {
		return nil
	}
	return reps
}

// replicasChanged is told by the replicas' renew loop that the live
// replicas changed: what is whose is looked at again at once (a dead
// or stopped replica's share of the events is the survivors').
func (d *Daemon) replicasChanged() {
	d.cfg.Telemetry.Metrics.SetReplicasLive(len(d.replicas.Members()))
	d.sched.ReplicasChanged()
	d.intake.Wake()
}

// replicaStatus is the replicas part of the status document.
func (d *Daemon) replicaStatus() *status.Replicas {
	r := &status.Replicas{Self: d.replicas.Self()}
	for _, m := range d.replicas.Members() {
		r.Live = append(r.Live, status.Replica{Name: m.Name, Invocation: m.Invocation, Renewed: m.Renewed})
	}
	return r
}

// viaIntake is the lander's and run control's port to intake, which is
// made after them (and is handed them).
type viaIntake struct{ d *Daemon }

func (v viaIntake) Consider(ctx context.Context, ev work.Event) error {
	return v.d.intake.Consider(ctx, ev)
}

func (v viaIntake) ConsiderControl(ctx context.Context, ev work.Event) error {
	return v.d.intake.ConsiderControl(ctx, ev)
}

func (v viaIntake) ControlError(ctx context.Context, ev work.Event, wf, msg string) {
	v.d.intake.ControlError(ctx, ev, wf, msg)
}

func (v viaIntake) Prepare(ctx context.Context, ev work.Event) (job.Repo, string, *mirror.ConflictError, error) {
	return v.d.intake.Prepare(ctx, ev)
}

// begin does the rest of what READY=1 waits for: the runner's known
// checks are listed and the owed ones loaded (a run whose check is
// final is never taken up again), the runs an earlier process left
// going are adopted, and the executor's orphan sweep keeps their
// sessions (one that fails starts the daemon degraded: health.go).
func (d *Daemon) begin(ctx context.Context) error {
	if err := d.live.Start(); err != nil {
		return err
	}
	listed, bad, err := d.out.ownChecks(ctx)
	if err != nil {
		return fmt.Errorf("list the runner's checks: %w", err)
	}
	for _, b := range bad {
		d.log.Warn("check record does not match its lexicon; ignored", "uri", b.URI.String(), "err", b.Err)
	}
	for _, c := range listed {
		d.keeper.Know(c.URI.RecordKey().String(), c.Value)
		d.keeper.KnowCID(c.URI.RecordKey().String(), c.CID)
	}
	d.keeper.LoadOwed()
	d.sched.Adopt(ctx)
	if err := d.sched.Sweep(ctx); err != nil {
		// Not a reason to exit (a crash loop tells no one why): start
		// degraded, try again with backoff.
		d.degrade(err)
	} else {
		d.health.setSwept()
	}
	return nil
}

// serve is the daemon's life after start: the parts' goroutines, status
// and the watchdog, then the handover.
func (d *Daemon) serve(ctx context.Context) error {
	// A run cancelled at the stop wait goes to the successor: the
	// cause tells the engine to run no step after the cancel.
	runCtx, stopRunsCause := context.WithCancelCause(context.WithoutCancel(ctx))
	stopRuns := func() { stopRunsCause(run.ErrStopped) }
	defer stopRuns()
	stopLive := d.live.Serve()
	wait := d.sched.Start(ctx, runCtx)
	var aux sync.WaitGroup
	auxCtx, stopAux := context.WithCancel(ctx)
	if d.cfg.Watchdog > 0 {
		aux.Go(func() { d.watchdog(auxCtx) })
	}
	if d.cfg.Intake.Firehose {
		aux.Go(func() { d.intake.Follow(auxCtx) })
	}
	if d.replicas != nil {
		// Renewed until the stop begins; then given back, so that the
		// others take the events at once while this one hands over.
		aux.Go(func() { d.replicas.Run(auxCtx) })
	}
	aux.Go(func() { d.keeper.PayOwed(auxCtx) })
	aux.Go(func() { d.watchExecutor(auxCtx) })
	aux.Go(func() { d.sched.Sweeps(auxCtx, d.cleaner.Failures) })
	aux.Go(func() { d.memory.Run(auxCtx) })
	if w := d.caps.Warmer; w != nil && d.cfg.WarmPods > 0 {
		// After the first sweep (begin), which deletes an earlier
		// process's warm pods; they go when this process stops.
		aux.Go(func() { w.KeepWarm(auxCtx, d.cfg.WarmPods) })
	}
	if d.lander != nil {
		aux.Go(func() { d.lander.Run(auxCtx) })
	}

	d.cfg.Notify("READY=1")
	d.tel.SetReady()
	d.log.Info("ready", "executor", d.cfg.Engine.Executor.Name(), "concurrency", d.cfg.Scheduler.Concurrency, "repos", len(d.cfg.Sources.Targets),
		"discover", d.cfg.Sources.Discover, "pulls", d.cfg.Sources.Pulls)
	d.status()

	d.intake.Run(ctx)

	stopAux()
	aux.Wait()
	d.handover(wait, stopRuns)
	stopLive() // after the state is saved: a successor's pushes go on from what the service has
	return nil
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
	going, queued, draining := d.sched.Counts()
	d.memory.Changed()
	m := d.cfg.Telemetry.Metrics
	m.SetQueueDepth(queued)
	m.SetRunsGoing(going)
	m.SetDegraded("executor", d.health.err() != nil)
	msg := fmt.Sprintf("STATUS=%d running, %d queued%s", going, queued, d.degradedStatus())
	if draining {
		msg = fmt.Sprintf("STATUS=stopping: %d running", going)
	}
	d.cfg.Notify(msg)
}

// degradedStatus is the part of STATUS= about the executor.
func (d *Daemon) degradedStatus() string {
	if err := d.health.err(); err != nil {
		return "; " + readiness.DegradedMark + ": " + err.Error()
	}
	return ""
}

// handover ends the process's work on SIGTERM: nothing new is claimed,
// queued runs are released (their checks stay queued: the successor's
// work), and started runs are detached for the successor to adopt (an
// executor that resumes sessions) or get StopWait to finish; what is
// still going then is cancelled and released the same way.
func (d *Daemon) handover(wait func(), stopRuns context.CancelFunc) {
	d.cfg.Notify("STOPPING=1")
	released, going := d.sched.Drain()
	d.status()
	d.log.Info("stopping: claiming nothing new", "released_queued", released, "running", going, "stop_wait", d.cfg.StopWait)

	done := make(chan struct{})
	go func() { wait(); close(done) }()
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
			left := d.sched.ReleaseRunning()
			d.log.Warn("stop wait over: cancelling the runs still going; their checks are released to the successor", "runs", left)
			stopRuns()
			<-done
			d.finishHandover(released, left)
			return
		}
	}
}

// cleanupWait bounds the wait at a stop for the sessions of ended runs
// to be removed.
const cleanupWait = 30 * time.Second

func (d *Daemon) extendTimeout() {
	usec := (d.cfg.StopWait + 30*time.Second).Microseconds()
	d.cfg.Notify(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", usec))
}

func (d *Daemon) finishHandover(released, cancelled int) {
	// The runs have ended or been handed over; what their clean-ups did
	// not finish by the deadline is the next start's sweep's.
	ctx, cancel := context.WithTimeout(context.Background(), cleanupWait)
	defer cancel()
	if err := d.cleaner.Wait(ctx); err != nil {
		d.log.Warn("stopping before every session was removed", "err", err)
	}
	if err := d.store.Save(); err != nil {
		d.log.Error("save state", "err", err)
	}
	detached := d.sched.Detached()
	d.log.Info(fmt.Sprintf("handed over %d runs", released+cancelled+detached), "queued", released, "going_on", detached, "cancelled_at_stop_wait", cancelled)
}
