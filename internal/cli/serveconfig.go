package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/observe/telemetry"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/lander"
	"knotless.dev/run/internal/parts/scheduler"
)

// serveInputs are what serve reads or makes besides the flags: the
// executor, the credentials, the caches, systemd's settings.
type serveInputs struct {
	Executor        executor.Executor
	Password        string
	Secrets         []scheduler.OperatorSecret
	PushCredentials mirror.PushCredentials
	Caches          run.Caches
	Notify          func(string)
	Watchdog        time.Duration
	// Invocation is systemd's INVOCATION_ID ("": not under systemd).
	Invocation string
	Logger     *slog.Logger
	// Telemetry is serve's metrics (nil without --metrics-listen), which
	// observe the engine and the parts, and the executor's credentials.
	Telemetry telemetry.Config
	// StopForeign stops what a predecessor on another executor handed
	// over (ExecutorFlags.stopForeign).
	StopForeign func(ctx context.Context, ref executor.Ref) error
	// Replicas joins the runner's replicas (serve --replicas); nil: one
	// process.
	Replicas func(ctx context.Context, changed func()) (daemon.Replicas, error)
}

// runner is --did, required.
func (c *ServeCmd) runner() (syntax.DID, error) {
	if c.DID == "" {
		return "", usageError{errors.New("serve: --did (the runner's DID) is required")}
	}
	runner, err := syntax.ParseDID(c.DID)
	if err != nil {
		return "", usageError{fmt.Errorf("--did %q: %w", c.DID, err)}
	}
	return runner, nil
}

// config maps the flags, and what serve read (in), onto the daemon's
// config, one group per part. It does no I/O: every flag's place is in
// its table test. A value one flag cannot hold is refused here, naming
// the flag; the rules between flags are daemon.Config.Validate's.
func (c *ServeCmd) config(in serveInputs) (daemon.Config, error) {
	runner, err := c.runner()
	if err != nil {
		return daemon.Config{}, err
	}
	var targets []ingest.Target
	for _, r := range c.Repos {
		t, err := ingest.ParseTarget(r)
		if err != nil {
			return daemon.Config{}, usageError{err}
		}
		targets = append(targets, t)
	}
	max, err := c.maximums(c.LimitsApplyTo == "all")
	if err != nil {
		return daemon.Config{}, err
	}
	caps, err := c.caps()
	if err != nil {
		return daemon.Config{}, err
	}
	classes, err := c.classes()
	if err != nil {
		return daemon.Config{}, err
	}
	checkout, outputs := c.bounds()
	tel := in.Telemetry
	tel.Listen = c.MetricsListen
	var engineObserver run.Observer
	if tel.Metrics != nil {
		engineObserver = tel.Metrics
	}
	return daemon.Config{
		Account: daemon.Account{
			Runner:    runner,
			PDS:       c.PDS,
			Password:  in.Password,
			Directory: pdsclient.NewDirectory(pdsclient.DirectoryConfig{PLCURL: c.PLCURL, TTL: c.IdentityTTL}),
		},
		Sources: daemon.Sources{Targets: targets, Discover: c.Discover, Pulls: c.Pulls, Relay: c.Relay},
		Intake:  intake.Config{Poll: c.Poll, Firehose: true, Caps: caps, Retention: c.Retention},
		Scheduler: scheduler.Config{
			Concurrency: c.Concurrency,
			Secrets:     in.Secrets,
		},
		Lander: lander.Config{Queue: c.Queue, Batch: c.QueueBatch},
		Live:   c.live(),
		Engine: run.Config{
			Executor:     in.Executor,
			DefaultImage: c.Image,
			Max:          max,
			Classes:      classes,
			Checkout:     checkout,
			Outputs:      outputs,
			Caches:       in.Caches,
			Observer:     engineObserver,
		},
		Git: mirror.Options{
			Policy:           mirror.Policy{AllowLocal: c.AllowLocalSources, AllowHTTP: c.AllowHTTPSources},
			Timeout:          c.GitTimeout,
			MaxWorkflowBytes: c.MaxWorkflowBytes,
			MaxWorkflows:     c.MaxWorkflows,
			MaxCheckoutBytes: exportBound(c.MaxCheckout),
		},
		PushCredentials:      in.PushCredentials,
		LogBlobs:             checks.LogBlobs(c.LogBlobs),
		StateDir:             c.StateDir,
		CacheDir:             c.CacheDir,
		StopWait:             c.StopWait,
		WarmPods:             c.WarmPods,
		UnsafeShellUntrusted: c.UnsafeShellUntrusted,
		StopForeign:          in.StopForeign,
		Replicas:             in.Replicas,
		Notify:               in.Notify,
		Watchdog:             in.Watchdog,
		Invocation:           in.Invocation,
		Logger:               in.Logger,
		Telemetry:            tel,
	}, nil
}
