package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/coreos/go-systemd/v22/journal"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge/pdsclient"
)

// ServeCmd is the runner daemon: `knotless-run serve --config FILE
// [REPO…]`, also the default command.
type ServeCmd struct {
	Config ConfigFile `help:"JSON file of flag values, keyed by long flag name (e.g. \"stop-wait\": \"15m\"); flags on the command line win." placeholder:"FILE"`
	Repos  []string   `arg:"" optional:"" name:"repo" help:"Repositories to watch: at://OWNER/dev.knotless.repo/NAME or OWNER/NAME (OWNER a DID or handle)."`

	DID         string        `name:"did" help:"The runner's DID (its atproto account)." placeholder:"DID"`
	PDS         string        `name:"pds" help:"The runner's PDS URL (default: from its DID document)." placeholder:"URL"`
	PLCURL      string        `name:"plc-url" help:"The did:plc directory to resolve DIDs with." default:"https://plc.directory" placeholder:"URL"`
	IdentityTTL time.Duration `name:"identity-ttl" help:"How long a resolved identity (a DID document, or a handle named as a repository's OWNER) is cached." default:"10m"`
	Concurrency int           `help:"Runs at once; more wait as queued checks." default:"1"`
	StopWait    time.Duration `help:"On SIGTERM, how long started runs may take to finish before they are released to the successor." default:"10m"`
	StateDir    string        `help:"State directory: state.json and secrets-key.json." default:"/var/lib/knotless" placeholder:"DIR"`
	CacheDir    string        `help:"Cache directory: git mirrors, run checkouts and the workflow caches (in DIR/caches)." default:"/var/cache/knotless" placeholder:"DIR"`
	ReadyFile   string        `help:"Keep this file while the daemon is ready (made at READY=1, removed on SIGTERM), for a probe: knotless-run ready --ready-file FILE." placeholder:"FILE"`
	Pulls       bool          `help:"Run open pulls too (untrusted: no secrets)."`
	Discover    bool          `help:"Also serve every repository whose record names this runner."`
	Queue       bool          `help:"Land the merge queue of the repositories whose lander this runner is: pre-flights and batches (untrusted: no secrets), and the push of each batch that passed to the repository's source."`
	Relay       string        `help:"Take events and discovery from this relay instead of the owners' PDSes." placeholder:"URL"`
	Poll        time.Duration `help:"Reconcile by listing records this often." default:"1m"`
	Retention   time.Duration `help:"Forget final work (done pushes, final checks) older than this; pushes, reruns and dispatches older than this are never acted on, and not listed past." default:"720h"`
	WarmPods    int           `name:"warm-pods" help:"With --executor kubernetes: keep N pods started ahead of runs, each the pod a trusted run of the default --image gets (no cache directories, no requests of its own); a run whose pod would be the same takes one, which serves that run only and is replaced. Each holds a node (one run per node); a run that waits for a node takes one back." default:"0" placeholder:"N"`
	Replicas    bool          `help:"With --executor kubernetes: run as one of several processes of this runner (same --did and configuration, each with its own --state-dir), which share the events through Leases in the runs' namespace; each run is driven by one of them. Not with --queue or --warm-pods."`
	ReplicaName string        `name:"replica-name" help:"With --replicas: this process's name among the runner's replicas, stable across its restarts and its own (default: the host name, a StatefulSet pod's name)." placeholder:"NAME"`
	LogBlobs    string        `name:"log-blobs" help:"Which runs' logs the final check carries as a blob: always, failures (runs that did not succeed) or never (a hosted PDS takes 1,000 blobs a day)." enum:"always,failures,never" default:"always"`

	AllowLocalSources bool          `help:"UNSAFE ON A SHARED RUNNER: also fetch from local paths and file:// URLs, named by repository records and pulls alike, so any tenant reads what this user can read (the runner's own state and cache directories stay refused). For tests and single-tenant machines (default: off: https only, and ssh for a repository's own source)."`
	AllowHTTPSources  bool          `help:"Also fetch from plaintext http:// sources (nothing protects the code on the wire)."`
	GitTimeout        time.Duration `help:"Deadline of every git command, fetches included." default:"5m"`
	MaxWorkflowBytes  int64         `help:"Largest workflow file read, in bytes." default:"262144"`
	MaxWorkflows      int           `help:"Most workflow files read per commit." default:"100"`

	AppPasswordFile string   `help:"File holding the runner's app password (default: $$CREDENTIALS_DIRECTORY/app-password). Never taken from the command line." placeholder:"FILE"`
	PushCredentials []string `name:"push-credential" sep:"none" help:"What --queue pushes to repository sources with, and where it may: a file holding an SSH private key (offered to ssh URLs of HOST only) or an HTTPS token, TOKEN or USER:TOKEN (offered to https URLs of HOST only; http:// only when the binding says so), offered to no other host and, with /PATH, to no repository outside that path prefix. Repeat it for each host or prefix. The secret is never taken from the command line." placeholder:"[SCHEME://]HOST[:PORT][/PATH]=FILE"`
	SecretsFile     string   `help:"Operator secrets, each scoped to repositories (see docs/reference/cli.md); they take precedence over sealed records (default: $$CREDENTIALS_DIRECTORY/secrets if present)." placeholder:"FILE"`

	// UnsafeShellUntrusted lets the shell executor run strangers' code:
	// on the host, beside the sealing key, the PDS session and the
	// kubeconfig.
	UnsafeShellUntrusted bool   `help:"Let --executor shell run --pulls, --discover or --queue work: strangers' code then runs on this host, beside the runner's sealing key, PDS session and kubeconfig. Only for a throwaway host." group:"limits"`
	LimitsApplyTo        string `help:"Which runs the --max-* and --allow-image limits bound: untrusted (pulls) or all." enum:"untrusted,all" default:"untrusted" group:"limits"`
	QueueBatch           int    `help:"Most pulls one merge-queue batch takes (--queue); the rest wait for the next batch." default:"8" group:"limits"`

	// ExecutorFlags choose and configure the executor, as for run.
	ExecutorFlags `embed:""`
	BoundFlags    `embed:""`
	CacheFlags    `embed:""`
	MetricsFlags  `embed:""`

	LimitFlags `embed:""`
	FloodFlags `embed:""`
	LiveFlags  `embed:""`
}

// Run runs the daemon until SIGTERM or SIGINT, then hands over.
func (c *ServeCmd) Run(ctx context.Context, env *Env) error {
	log := env.Logger
	if ok, _ := journal.StderrIsJournalStream(); ok && journal.Enabled() {
		log = slog.New(newJournalHandler(minLevel(env.Logger)))
		routeClientGo(log)
		// What stops the daemon goes to the journal as an error, with
		// its priority, not as a plain line of the stderr stream.
		if err := c.serve(ctx, env, log); err != nil {
			log.Error("knotless-run serve: "+err.Error(), "err", err)
			// The code the error would have on a terminal: a refused
			// configuration exits ExitConfig, which the units'
			// RestartPreventExitStatus= stops on.
			return exitError{code: exitCode(io.Discard, err)}
		}
		return nil
	}
	return c.serve(ctx, env, log)
}

// serve maps the flags onto the daemon's config (config) and checks the
// rules between them (daemon.Config.Validate) before it reads any file
// or makes any directory, then reads the credentials, the caches and
// systemd's settings into the config and runs the daemon.
func (c *ServeCmd) serve(ctx context.Context, env *Env, log *slog.Logger) error {
	runner, err := c.runner()
	if err != nil {
		return err
	}
	tel, observer, err := c.telemetry()
	if err != nil {
		return err
	}
	replica, err := c.replicaName()
	if err != nil {
		return err
	}
	c.driver, c.driverInvocation = replica, invocation(env)
	exec, err := c.newExecutor(env, runner.String(), c.Concurrency, c.transfer(c.CacheMax), log, observer)
	if err != nil {
		return err
	}
	in := serveInputs{Executor: exec, Logger: log, Telemetry: tel, StopForeign: c.stopForeign(env, runner.String(), log)}
	in.Replicas = c.joinReplicas(exec, runner.String(), replica, c.driverInvocation, log)
	cfg, err := c.config(in)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		// Validate's rules are between flags: no restart mends them.
		return usageError{err}
	}
	if flags := cfg.UnsafeShell(); flags != "" {
		log.Warn("UNSAFE: --unsafe-shell-untrusted: --executor shell runs strangers' code ("+flags+") on this host, beside the runner's sealing key, PDS session and kubeconfig",
			"component", "serve", "executor", c.Executor, "pulls", c.Pulls, "discover", c.Discover)
	}
	if in.Password, err = c.readPassword(env); err != nil {
		return err
	}
	secretsFile := ""
	if in.Secrets, secretsFile, err = c.readSecrets(env); err != nil {
		return err
	}
	if in.PushCredentials, err = c.pushCredentials(env); err != nil {
		return err
	}
	// The rules over the files read (secrets' scopes among them) before
	// anything is made: a refused start leaves no directory behind.
	if cfg, err = c.config(in); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		var se *daemon.SecretError
		if errors.As(err, &se) && secretsFile != "" {
			return usageError{fmt.Errorf("--secrets-file %s: %w", secretsFile, err)}
		}
		return usageError{err}
	}
	if in.Caches, err = c.openCaches(c.CacheDir); err != nil {
		return err
	}
	in.Watchdog, _ = sddaemon.SdWatchdogEnabled(false)
	in.Invocation = env.Getenv("INVOCATION_ID")
	if in.Notify, err = c.notifier(log); err != nil {
		return err
	}
	if cfg, err = c.config(in); err != nil {
		return err
	}
	err = daemon.Run(ctx, cfg)
	switch {
	case errors.Is(err, context.Canceled):
		return nil
	case errors.Is(err, pdsclient.ErrNoPassword):
		return c.noPassword(env, err)
	case errors.As(err, new(daemon.InUseError)):
		// Another live process owns the state directory or the runner
		// here: a restart would be refused the same way.
		return usageError{err}
	}
	return err
}
