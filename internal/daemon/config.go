package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/kube/replicas"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/observe/telemetry"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/lander"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/parts/scheduler"
)

// Config configures the daemon, one group per part. The cli fills it
// from flags, the config file and credential files; nothing here reads
// the environment.
type Config struct {
	// Account is who the runner is and how it reaches atproto.
	Account Account
	// Sources are where the work is listed from.
	Sources Sources
	// Intake, Scheduler and Lander configure those parts (a Lander
	// without Queue is none).
	Intake    intake.Config
	Scheduler scheduler.Config
	Lander    lander.Config
	// Engine configures the runs (run.Config): the Executor, the
	// default image, the operator's maximums (Max.All: the author caps
	// count owners' pushes too), the transfer bounds and the caches.
	// Its Logger and Runner are the daemon's.
	Engine run.Config
	// LogBlobs is which runs' logs their final check carries as a
	// blob (--log-blobs; empty: every run's).
	LogBlobs checks.LogBlobs
	// Live is live output: the listener, the output service, bounds.
	Live live.Config
	// Git is what git sources the mirrors may fetch from (https only by
	// default), git's deadline and the workflow and checkout limits. The
	// state and cache directories are always forbidden as local sources.
	Git mirror.Options
	// PushCredentials are the keys and tokens the lander's push to the
	// sources uses, each offered only to the host (and path prefix) it
	// is bound to (none: the push offers nothing).
	PushCredentials mirror.PushCredentials

	StateDir string
	CacheDir string
	// StopWait is how long started runs may take to finish at SIGTERM
	// on an executor that cannot hand them over.
	StopWait time.Duration
	// Retry paces what is tried again after a failure that is not the
	// work's: an owed check, the executor's sweep and health.
	Retry Retry
	// WarmPods is how many sessions the executor keeps started ahead of
	// runs (executor.Warmer; serve --warm-pods); 0 keeps none.
	WarmPods int
	// UnsafeShellUntrusted lets the shell executor run strangers' work
	// (pulls, discovery, the merge queue): on the runner's own host.
	UnsafeShellUntrusted bool
	// StopForeign stops a session an earlier process handed over on
	// another executor than Engine.Executor (scheduler.Ports.StopForeign);
	// nil: this runner cannot reach any other.
	StopForeign func(ctx context.Context, ref executor.Ref) error

	// Replicas, when set, joins this process to the runner's replicas
	// (serve --replicas): it is called once the state directory is
	// this process's, with what to call when the live replicas change.
	// nil: one process drives every event.
	Replicas func(ctx context.Context, changed func()) (Replicas, error)

	// Notify sends one sd_notify message (nil: not under systemd).
	Notify func(state string)
	// OnCheck, when set, is told of every check record written, after the
	// write (tests and metrics).
	OnCheck func(key string, c forge.Check)
	// Watchdog is systemd's WatchdogSec (0: off).
	Watchdog time.Duration
	// Invocation is systemd's INVOCATION_ID of the unit ("": not under
	// systemd), written with the pid, host and start time into the
	// state directory's lock (and the runner's lock on this host) so a
	// refused second process names this one.
	Invocation string
	Logger     *slog.Logger

	// Telemetry is what the daemon tells of itself besides its journal:
	// its metrics (nil: none) and where they are served (--metrics-listen),
	// and the executor's credentials for the status.
	Telemetry telemetry.Config
}

// Replicas is this process's place among the runner's processes
// (replicas.Replica): it keeps it until Run's ctx ends, says which
// events are this replica's, and keeps its runs' checkpoints in the
// cluster for a survivor.
type Replicas interface {
	Run(ctx context.Context)
	Mine(evKey string) bool
	Self() string
	Members() []replicas.Member
	// The records of the runs it drives, and its claims on the runs
	// of replicas that died (replicas.Runs).
	scheduler.Drivers
}

// Account is the runner's atproto account.
type Account struct {
	// Runner is the runner's DID; PDS its PDS URL (default: from its DID
	// document).
	Runner syntax.DID
	PDS    string
	// Password is the app password (read from a file by the caller).
	Password string
	// Directory resolves DIDs (PLC URL configured by the caller).
	Directory identity.Directory
	HTTP      *http.Client
}

// Sources are where the work is listed from (ingest.Lister).
type Sources struct {
	Targets  []ingest.Target
	Discover bool
	Pulls    bool
	// Relay, when set, is where events and discovery come from instead
	// of the owners' PDSes.
	Relay string
	// Listing bounds the reconcile's listings of other accounts' PDSes
	// (zero fields: the defaults).
	Listing Listing
}

// Listing bounds a reconcile's listings: the pages and records of each
// (pdsclient.ListLimits: 100 pages, 10,000 records), and the deadline of
// each listing task and how many run at once (ingest.Bounds: 1 min, 8).
// A hostile or slow PDS holds no reconcile past them.
type Listing struct {
	Limits pdsclient.ListLimits
	Bounds ingest.Bounds
}

// Retry says how the daemon waits after a failure that is not the
// work's: a check the PDS did not take, an executor that is
// unreachable. Backoff is the first wait (default 2 s); each failure
// doubles it up to MaxBackoff (default 5 min).
type Retry struct {
	Backoff    time.Duration
	MaxBackoff time.Duration
}

func (c *Config) defaults() {
	if c.Scheduler.Concurrency < 1 {
		c.Scheduler.Concurrency = 1
	}
	if c.Notify == nil {
		c.Notify = func(string) {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Account.HTTP == nil {
		c.Account.HTTP = &http.Client{Timeout: 2 * time.Minute}
	}
	if c.Retry.Backoff <= 0 {
		c.Retry.Backoff = 2 * time.Second
	}
	if c.Retry.MaxBackoff <= 0 {
		c.Retry.MaxBackoff = 5 * time.Minute
	}
}

// Validate holds every rule between settings, each error naming the
// flags involved: something to run, the shell executor kept to the
// owner's own pushes, the merge queue's batch, the operator's secrets
// scoped to repositories (and never unscoped with discovery).
func (c *Config) Validate() error {
	if len(c.Sources.Targets) == 0 && !c.Sources.Discover {
		return errors.New("serve: no repositories: name some (OWNER/NAME) or pass --discover")
	}
	if flags := c.untrustedWork(); len(flags) > 0 && c.Engine.Executor != nil && c.Engine.Executor.Name() == "shell" && !c.UnsafeShellUntrusted {
		return fmt.Errorf("serve: --executor shell with %s would run strangers' code on this host, beside the runner's sealing key, PDS session and kubeconfig; use --executor kubernetes or docker, or pass --unsafe-shell-untrusted on a throwaway host", strings.Join(flags, " and "))
	}
	if err := c.Live.Validate(); err != nil {
		return err
	}
	if c.WarmPods < 0 {
		return fmt.Errorf("--warm-pods %d: want 0 or more", c.WarmPods)
	}
	if c.WarmPods > 0 && executor.CapabilitiesOf(c.Engine.Executor).Warmer == nil {
		return fmt.Errorf("--warm-pods %d: only --executor kubernetes keeps warm pods", c.WarmPods)
	}
	if c.Replicas != nil {
		if c.Lander.Queue {
			return errors.New("serve: --replicas with --queue: the merge queue runs in one process only; run it on a runner of its own")
		}
		if c.WarmPods > 0 {
			return fmt.Errorf("serve: --replicas with --warm-pods %d: warm pods are one process's; use one or the other", c.WarmPods)
		}
	}
	if c.Lander.Queue && c.Lander.Batch < 1 {
		return fmt.Errorf("--queue-batch %d: want 1 or more", c.Lander.Batch)
	}
	for _, s := range c.Scheduler.Secrets {
		if len(s.Repos) == 0 {
			return &SecretError{Name: s.Name, Why: "names no repository"}
		}
		if c.Sources.Discover && s.Unscoped() {
			return &SecretError{Name: s.Name, Why: `is for every repository ("*", or the older name-to-value form), and --discover serves any repository that names this runner: scope it with "repos"`}
		}
	}
	return nil
}

// SecretError is an operator secret Validate refuses.
type SecretError struct {
	Name, Why string
}

func (e *SecretError) Error() string { return "secret " + e.Name + " " + e.Why }

// UntrustedWork names the flags that make the runner run strangers'
// work: pulls, the merge queue, discovery.
func (c *Config) untrustedWork() []string {
	var flags []string
	if c.Sources.Pulls {
		flags = append(flags, "--pulls")
	}
	if c.Lander.Queue {
		flags = append(flags, "--queue")
	}
	if c.Sources.Discover {
		flags = append(flags, "--discover")
	}
	return flags
}

// UnsafeShell says which flags make the shell executor run strangers'
// work, when --unsafe-shell-untrusted allows it: the caller warns.
func (c *Config) UnsafeShell() string {
	if !c.UnsafeShellUntrusted || c.Engine.Executor == nil || c.Engine.Executor.Name() != "shell" {
		return ""
	}
	return strings.Join(c.untrustedWork(), " and ")
}
