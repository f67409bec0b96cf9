package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/bluesky-social/indigo/atproto/syntax"
	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/coreos/go-systemd/v22/journal"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/mirror"
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
	Retention   time.Duration `help:"Forget final work (done pushes, final checks) older than this; pushes older than this are never run." default:"720h"`

	AllowLocalSources bool          `help:"UNSAFE ON A SHARED RUNNER: also fetch from local paths and file:// URLs, named by repository records and pulls alike, so any tenant reads what this user can read (the runner's own state and cache directories stay refused). For tests and single-tenant machines. Default: https only (and ssh for a repository's own source)."`
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

	LimitFlags `embed:""`
	FloodFlags `embed:""`
}

// ConfigFile is the --config flag: before the other flags are resolved
// it adds a resolver reading the file's JSON object, keyed by long flag
// name.
type ConfigFile string

// BeforeResolve reads the file and adds its resolver.
func (c ConfigFile) BeforeResolve(kctx *kong.Context, trace *kong.Path) error {
	name, _ := kctx.FlagValue(trace.Flag).(ConfigFile)
	if name == "" {
		return nil
	}
	r, err := configResolver(kctx, string(name))
	if err != nil {
		return err
	}
	kctx.AddResolver(r)
	return nil
}

func configResolver(kctx *kong.Context, name string) (kong.Resolver, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var values map[string]any
	if err := json.Unmarshal(b, &values); err != nil {
		return nil, fmt.Errorf("--config %s: %w", name, err)
	}
	known := map[string]bool{}
	for _, f := range kctx.Flags() {
		known[f.Name] = true
	}
	var unknown []string
	for k := range values {
		if !known[k] || k == "config" || k == "help" {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("--config %s: unknown keys %s (keys are long flag names)", name, strings.Join(unknown, ", "))
	}
	if _, ok := values["app-password"]; ok {
		return nil, fmt.Errorf("--config %s: the app password is read from a file only (app-password-file)", name)
	}
	return kong.ResolverFunc(func(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
		v, ok := values[flag.Name]
		if !ok {
			return nil, nil
		}
		if m, isMap := v.(map[string]any); isMap {
			// KEY=VALUE flags (node-selector) take a JSON object.
			parts := make([]string, 0, len(m))
			for k, x := range m {
				parts = append(parts, fmt.Sprintf("%s=%v", k, x))
			}
			sort.Strings(parts)
			return strings.Join(parts, ";"), nil
		}
		return v, nil
	}), nil
}

// Run runs the daemon until SIGTERM or SIGINT, then hands over.
func (c *ServeCmd) Run(ctx context.Context, env *Env) error {
	log := env.Logger
	if ok, _ := journal.StderrIsJournalStream(); ok && journal.Enabled() {
		log = slog.New(newJournalHandler(minLevel(env.Logger)))
		// What stops the daemon goes to the journal as an error, with
		// its priority, not as a plain line of the stderr stream.
		if err := c.serve(ctx, env, log); err != nil {
			log.Error("knotless-run serve: "+err.Error(), "err", err)
			return exitError{code: ExitError}
		}
		return nil
	}
	return c.serve(ctx, env, log)
}

func (c *ServeCmd) serve(ctx context.Context, env *Env, log *slog.Logger) error {
	if c.DID == "" {
		return errors.New("serve: --did (the runner's DID) is required")
	}
	runner, err := syntax.ParseDID(c.DID)
	if err != nil {
		return fmt.Errorf("--did %q: %w", c.DID, err)
	}
	var targets []ingest.Target
	for _, r := range c.Repos {
		t, err := ingest.ParseTarget(r)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	if len(targets) == 0 && !c.Discover {
		return errors.New("serve: no repositories: name some (OWNER/NAME) or pass --discover")
	}
	if err := c.checkShellUntrusted(log); err != nil {
		return err
	}
	max, err := c.maximums(c.LimitsApplyTo == "all")
	if err != nil {
		return err
	}
	caps, err := c.caps()
	if err != nil {
		return err
	}
	if c.Queue && c.QueueBatch < 1 {
		return fmt.Errorf("--queue-batch %d: want 1 or more", c.QueueBatch)
	}
	password, err := c.readPassword(env)
	if err != nil {
		return err
	}
	secrets, secretsFile, err := c.readSecrets(env)
	if err != nil {
		return err
	}
	if c.Discover {
		if err := unscopedWithDiscover(secretsFile, secrets); err != nil {
			return err
		}
	}
	pushCredentials, err := c.pushCredentials(env)
	if err != nil {
		return err
	}
	exec, err := c.newExecutor(env, runner.String(), log)
	if err != nil {
		return err
	}
	caches, err := c.openCaches(c.CacheDir)
	if err != nil {
		return err
	}
	watchdog, _ := sddaemon.SdWatchdogEnabled(false)
	notify, err := c.notifier(log)
	if err != nil {
		return err
	}
	checkoutBound, outputsBound := c.bounds()
	err = daemon.Run(ctx, daemon.Config{
		Runner:          runner,
		PDS:             c.PDS,
		Password:        password,
		Directory:       forge.NewDirectory(forge.DirectoryConfig{PLCURL: c.PLCURL, TTL: c.IdentityTTL}),
		Targets:         targets,
		Discover:        c.Discover,
		Pulls:           c.Pulls,
		Queue:           c.Queue,
		PushCredentials: pushCredentials,
		Relay:           c.Relay,
		Firehose:        true,
		Poll:            c.Poll,
		Executor:        exec,
		DefaultImage:    c.Image,
		Checkout:        checkoutBound,
		Outputs:         outputsBound,
		Concurrency:     c.Concurrency,
		StopWait:        c.StopWait,
		StateDir:        c.StateDir,
		CacheDir:        c.CacheDir,
		Caches:          caches,
		Secrets:         secrets,
		Git: mirror.Options{
			Policy:           mirror.Policy{AllowLocal: c.AllowLocalSources, AllowHTTP: c.AllowHTTPSources},
			Timeout:          c.GitTimeout,
			MaxWorkflowBytes: c.MaxWorkflowBytes,
			MaxWorkflows:     c.MaxWorkflows,
			MaxCheckoutBytes: exportBound(c.MaxCheckout),
		},
		Notify:    notify,
		Watchdog:  watchdog,
		Logger:    log,
		Retention: c.Retention,

		Max:        max,
		Caps:       caps,
		QueueBatch: c.QueueBatch,
	})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// checkShellUntrusted refuses to run strangers' code with the shell
// executor: its steps are processes of this host, next to the sealing
// key, the PDS session and the kubeconfig. --unsafe-shell-untrusted
// overrides it, loudly.
func (c *ServeCmd) checkShellUntrusted(log *slog.Logger) error {
	if c.Executor != "shell" || (!c.Pulls && !c.Discover && !c.Queue) {
		return nil
	}
	var flags []string
	if c.Pulls {
		flags = append(flags, "--pulls")
	}
	if c.Queue {
		flags = append(flags, "--queue")
	}
	if c.Discover {
		flags = append(flags, "--discover")
	}
	which := strings.Join(flags, " and ")
	if !c.UnsafeShellUntrusted {
		return fmt.Errorf("serve: --executor shell with %s would run strangers' code on this host, beside the runner's sealing key, PDS session and kubeconfig; use --executor kubernetes or docker, or pass --unsafe-shell-untrusted on a throwaway host", which)
	}
	log.Warn("UNSAFE: --unsafe-shell-untrusted: --executor shell runs strangers' code ("+which+") on this host, beside the runner's sealing key, PDS session and kubeconfig",
		"component", "serve", "executor", c.Executor, "pulls", c.Pulls, "discover", c.Discover)
	return nil
}

// pushCredentials reads the lander's push credentials, each bound to a
// host (and path prefix): --push-credential, repeated. A credential
// bound to nothing stops the start: the file of the older flag's form
// (--push-credential FILE) or its default,
// $CREDENTIALS_DIRECTORY/push-credential, would be offered to whatever
// host a repository record names.
func (c *ServeCmd) pushCredentials(env *Env) (mirror.PushCredentials, error) {
	var creds mirror.PushCredentials
	for _, spec := range c.PushCredentials {
		cred, err := mirror.LoadPushCredential(spec)
		if err != nil {
			return nil, err
		}
		creds = append(creds, cred)
	}
	if dir := env.Getenv("CREDENTIALS_DIRECTORY"); dir != "" {
		name := filepath.Join(dir, "push-credential")
		if _, err := os.Stat(name); err == nil {
			return nil, fmt.Errorf("%s: a push credential bound to no host (the older default of --push-credential) would be offered to "+
				"whatever host a repository record names; load it under another name and bind it: --push-credential HOST=FILE "+
				"or HOST/PATH=FILE (the NixOS module's pushCredentials = [ { host = …; paths = [ … ]; file = …; } ])", name)
		}
	}
	return creds, nil
}

// readPassword reads the app password from --app-password-file, else
// $CREDENTIALS_DIRECTORY/app-password. Without either, a session saved
// in the state directory must do.
func (c *ServeCmd) readPassword(env *Env) (string, error) {
	name := c.AppPasswordFile
	explicit := name != ""
	if !explicit {
		dir := env.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return "", nil
		}
		name = filepath.Join(dir, "app-password")
	}
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("--app-password-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// readSecrets reads the operator secrets file (its format:
// operatorSecretsFile) and returns its secrets and its name.
func (c *ServeCmd) readSecrets(env *Env) ([]daemon.OperatorSecret, string, error) {
	name := c.SecretsFile
	explicit := name != ""
	if !explicit {
		dir := env.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return nil, "", nil
		}
		name = filepath.Join(dir, "secrets")
	}
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("--secrets-file: %w", err)
	}
	secrets, err := parseOperatorSecrets(name, b)
	if err != nil {
		return nil, "", fmt.Errorf("--secrets-file %s: %w", name, err)
	}
	return secrets, name, nil
}

// SecretCmd groups the secret helpers.
type SecretCmd struct {
	Seal SecretSealCmd `cmd:"" help:"Seal a secret value to a runner's key and print the dev.knotless.secret record to write."`
}

// SecretSealCmd prints a sealed secret record. The value comes from
// stdin, never from the command line. The sealed bytes hold the value
// bound to the repository, name, runner and scope (forge.Envelope), so
// they open for this record's repository only.
type SecretSealCmd struct {
	Runner    string `help:"The runner's DID." required:"" placeholder:"DID"`
	Key       string `help:"The runner's public sealing key (base64, from its secrets-key.json or its log at first start)." required:"" placeholder:"KEY"`
	Repo      string `help:"The repository: at://OWNER/dev.knotless.repo/NAME (OWNER a DID)." required:"" placeholder:"AT-URI"`
	Name      string `help:"The secret's name as workflows grant it." required:"" placeholder:"NAME"`
	Scope     string `help:"Which runs get the value: push (trusted runs; the only scope)." enum:"push" default:"push"`
	ValueFile string `help:"Read the value from FILE instead of stdin." placeholder:"FILE"`
}

// Run seals the value and prints the record as JSON.
func (c *SecretSealCmd) Run(env *Env) error {
	if _, err := syntax.ParseDID(c.Runner); err != nil {
		return fmt.Errorf("--runner: %w", err)
	}
	if t, err := ingest.ParseTarget(c.Repo); err != nil || !strings.HasPrefix(c.Repo, "at://") || !t.Owner.IsDID() ||
		forge.RepoURI(syntax.DID(t.Owner.String()), t.Name).String() != c.Repo {
		// The sealed envelope is compared byte for byte with the run's
		// repository: the canonical AT-URI, with the owner's DID.
		return fmt.Errorf("--repo %q: want at://DID/%s/NAME", c.Repo, forge.CollectionRepo)
	}
	pub, err := forge.DecodeKey(c.Key)
	if err != nil {
		return fmt.Errorf("--key: %w", err)
	}
	var value []byte
	if c.ValueFile != "" {
		value, err = os.ReadFile(c.ValueFile)
	} else {
		value, err = readAll(env)
	}
	if err != nil {
		return fmt.Errorf("read the value: %w", err)
	}
	value = []byte(strings.TrimSuffix(string(value), "\n"))
	if len(value) == 0 {
		return errors.New("the value is empty")
	}
	scope := c.Scope
	if scope == "" {
		scope = forge.ScopePush
	}
	sealed, err := forge.SealSecret(pub, forge.Envelope{Repo: c.Repo, Name: c.Name, Runner: c.Runner, Scope: scope, Value: value})
	if err != nil {
		return err
	}
	rec := forge.Secret{Type: forge.CollectionSecret, Repo: c.Repo, Name: c.Name, Runner: c.Runner, Key: c.Key,
		Scope: scope, Sealed: sealed, CreatedAt: forge.Now()}
	cat, err := forge.NewCatalog()
	if err != nil {
		return err
	}
	if _, err := cat.Encode(forge.CollectionSecret, rec); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s\n", b)
	return nil
}

func readAll(env *Env) ([]byte, error) {
	if env.Stdin == nil {
		return nil, errors.New("no stdin")
	}
	return io.ReadAll(io.LimitReader(env.Stdin, 64<<10))
}

// journalHandler is an slog.Handler writing structured entries to the
// journal, used when stderr is the journal's stream.
type journalHandler struct {
	level  slog.Level
	attrs  []slog.Attr
	prefix string
}

func newJournalHandler(level slog.Level) *journalHandler { return &journalHandler{level: level} }

func (h *journalHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *journalHandler) Handle(_ context.Context, r slog.Record) error {
	vars := map[string]string{"SYSLOG_IDENTIFIER": "knotless-run"}
	var add func(prefix string, a slog.Attr)
	add = func(prefix string, a slog.Attr) {
		if a.Value.Kind() == slog.KindGroup {
			for _, g := range a.Value.Group() {
				add(prefix+a.Key+"_", g)
			}
			return
		}
		vars[journalField(prefix+a.Key)] = a.Value.String()
	}
	for _, a := range h.attrs {
		add("", a)
	}
	r.Attrs(func(a slog.Attr) bool { add(h.prefix, a); return true })
	return journal.Send(r.Message, journalPriority(r.Level), vars)
}

func (h *journalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	for _, a := range attrs {
		a.Key = h.prefix + a.Key
		c.attrs = append(append([]slog.Attr(nil), c.attrs...), a)
	}
	return &c
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.prefix = h.prefix + name + "_"
	return &c
}

func journalPriority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	default:
		return journal.PriDebug
	}
}

// journalField makes a journal field name: upper case letters, digits
// and underscores, not starting with an underscore.
func journalField(k string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(k) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := strings.TrimLeft(b.String(), "_")
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		s = "F_" + s
	}
	return s
}

// minLevel finds the lowest level the logger writes.
func minLevel(l *slog.Logger) slog.Level {
	for _, lvl := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if l.Enabled(context.Background(), lvl) {
			return lvl
		}
	}
	return slog.LevelError
}
