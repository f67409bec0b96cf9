// Package cli is knotless-run's command line: kong commands, logger set-up
// and the mapping of failures to exit codes. It is the only package that
// reads the process environment or knows about flags.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"
	charmlog "github.com/charmbracelet/log"
	"golang.org/x/term"

	"knotless.dev/run/internal/lib/termsafe"
	"knotless.dev/run/internal/lib/version"
)

// Exit codes.
const (
	ExitSuccess   = 0
	ExitFailure   = 1   // a run failed: a step exited non-zero or timed out
	ExitError     = 2   // bad input, or the runner or infrastructure failed
	ExitConfig    = 78  // the command line or --config file is wrong (sysexits' EX_CONFIG): trying again will not help
	ExitCancelled = 130 // interrupted
)

// Env is what a command may touch of the process.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	Logger *slog.Logger
}

// CLI is the command tree.
type CLI struct {
	LogFormat string `help:"Log format: auto (text on a terminal, logfmt otherwise), text, logfmt or json." enum:"auto,text,logfmt,json" default:"auto"`
	LogLevel  string `help:"Log level: debug, info, warn or error." enum:"debug,info,warn,error" default:"info"`

	Serve         ServeCmd         `cmd:"" default:"withargs" help:"The runner daemon (the default command): watch the repositories that name this runner and run their workflows."`
	Secret        SecretCmd        `cmd:"" help:"Seal secrets to a runner."`
	Login         LoginCmd         `cmd:"" help:"Log in to your PDS with an app password; the commands that write records (cancel, rerun, dispatch, secret set) write them with this session."`
	Logout        LogoutCmd        `cmd:"" help:"End the session login kept and remove it."`
	Runs          RunsCmd          `cmd:"" help:"List the checks of a repository across the runners its record names, newest first."`
	Watch         WatchCmd         `cmd:"" help:"Follow a run to its end: its steps and live log; --exit-status exits non-zero when it did not succeed."`
	Cancel        CancelCmd        `cmd:"" help:"Stop a queued or running check: write the dev.knotless.cancel record (or --print it)."`
	Rerun         RerunCmd         `cmd:"" help:"Run a check's event again: every workflow, one, or the failed ones; write the dev.knotless.rerun record (or --print it)."`
	Dispatch      DispatchCmd      `cmd:"" help:"Run an on: dispatch workflow on a branch, with inputs: write the dev.knotless.dispatch record (or --print it)."`
	Run           RunCmd           `cmd:"" help:"Run one workflow now, without the daemon."`
	Cache         CacheCmd         `cmd:"" help:"Show and clear the store of workflow caches."`
	Validate      ValidateCmd      `cmd:"" help:"Check workflow files and print every error with file:line:column."`
	Kubeconfig    KubeconfigCmd    `cmd:"" help:"Mint the runner's scoped 24-hour kubeconfig (or --check one)."`
	Manifests     ManifestsCmd     `cmd:"" help:"Print the YAML that runs the runner inside the cluster: runs namespace, ServiceAccount, Role, RoleBinding, StatefulSet (and its PodDisruptionBudget with --replicas above 1)."`
	Ready         ReadyCmd         `cmd:"" help:"Readiness probe: exit 0 while the daemon of serve --ready-file is ready, else print why and exit 1."`
	Logs          LogsCmd          `cmd:"" help:"Print a check's output; with --follow, follow it live to the run's end."`
	OutputService OutputServiceCmd `cmd:"" name:"output-service" help:"The output service: take runs' output pushed by the runners named with --runner (atproto service auth) and serve it to readers."`
	Status        StatusCmd        `cmd:"" help:"What the daemon is doing: runs going with their step and age, queued work, owed checks, credentials, why it is degraded; read from state.json when it is not running."`
	Completion    CompletionCmd    `cmd:"" help:"Print the shell completion hook for bash, zsh or fish (commands, flags, check keys, and your repositories' names for --repo)."`
	Version       VersionCmd       `cmd:"" help:"Print the version."`
}

// exitError carries an exit code out of a command that has already told
// the user what happened.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a command line that cannot work as written (a missing
// or contradictory argument, a value of the wrong form): the same exit
// code as kong's own parse errors, ExitConfig, in every command.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// exitRequest is how kong's --help asks to exit without killing a test.
type exitRequest int

// Main runs the command line and returns the process exit code.
func Main(ctx context.Context, args []string, env Env) (code int) {
	defer func() {
		if r := recover(); r != nil {
			req, ok := r.(exitRequest)
			if !ok {
				panic(r)
			}
			code = int(req)
		}
	}()
	var cli CLI
	parser, err := kong.New(&cli,
		kong.Name("knotless-run"),
		kong.Description("The CI runner of knotless: runs workflows as Kubernetes Jobs."),
		kong.Writers(env.Stdout, env.Stderr),
		kong.Exit(func(code int) { panic(exitRequest(code)) }),
		kong.UsageOnError(),
		executorVars(),
		kong.ValueFormatter(helpValue),
	)
	if err != nil {
		fmt.Fprintf(env.Stderr, "knotless-run: %v\n", err)
		return ExitError
	}
	placeholders(parser.Model)
	if completeLine(parser, env) {
		return ExitSuccess
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		// An unknown flag or settings key, a bad value, a missing flag:
		// systemd's RestartPreventExitStatus= (the NixOS module, deploy/)
		// stops restarting on this code instead of every few seconds.
		fmt.Fprintf(env.Stderr, "knotless-run: %v\n", err)
		return ExitConfig
	}
	if err := unknownCommand(parser, kctx, args, cli.Serve.Repos); err != nil {
		fmt.Fprintf(env.Stderr, "knotless-run: %s\n", termsafe.Text(err.Error()))
		return ExitConfig
	}
	env.Logger = newLogger(env.Stderr, cli.LogFormat, cli.LogLevel)
	routeClientGo(env.Logger)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	kctx.BindTo(ctx, (*context.Context)(nil))
	err = kctx.Run(&env)
	return exitCode(env.Stderr, err)
}

// exitCode is the one place a failure is formatted for a human. An
// error may carry what strangers wrote (a workflow's name, a repository
// record's field, a server's answer): it is shown escaped
// (termsafe.Text), its own lines kept.
func exitCode(stderr io.Writer, err error) int {
	var ee exitError
	switch {
	case err == nil:
		return ExitSuccess
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "knotless-run: %s\n", termsafe.Text(err.Error()))
		return ExitConfig
	default:
		fmt.Fprintf(stderr, "knotless-run: %s\n", termsafe.Text(err.Error()))
		return ExitError
	}
}

// LogTimeFormat is the time of each log record on stderr: RFC 3339 with
// milliseconds. (Under journald each entry has the journal's own
// microsecond time: journalctl -o short-precise.)
const LogTimeFormat = "2006-01-02T15:04:05.000Z07:00"

func newLogger(w io.Writer, format, level string) *slog.Logger {
	if format == "auto" {
		format = "logfmt"
		if f, ok := w.(interface{ Fd() uintptr }); ok && term.IsTerminal(int(f.Fd())) {
			format = "text"
		}
	}
	formatter := map[string]charmlog.Formatter{
		"text":   charmlog.TextFormatter,
		"logfmt": charmlog.LogfmtFormatter,
		"json":   charmlog.JSONFormatter,
	}[format]
	lvl, _ := charmlog.ParseLevel(level)
	h := charmlog.NewWithOptions(w, charmlog.Options{
		Formatter:       formatter,
		Level:           lvl,
		ReportTimestamp: true,
		// Milliseconds: the phases of a run (docs/performance.md) are
		// read from these records, and seconds hide most of them.
		TimeFormat: LogTimeFormat,
	})
	if format == "json" {
		// charmbracelet/log writes a time.Duration as its nanoseconds
		// in JSON; a reader wants "1.5s", as text and logfmt say it.
		return slog.New(durationStrings{h})
	}
	return slog.New(h)
}

// durationStrings is a handler that gives the next one every
// time.Duration attribute as its String ("1.5s"), in groups too.
type durationStrings struct{ slog.Handler }

func (d durationStrings) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(durationAttr(a))
		return true
	})
	return d.Handler.Handle(ctx, out)
}

func (d durationStrings) WithAttrs(attrs []slog.Attr) slog.Handler {
	conv := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		conv[i] = durationAttr(a)
	}
	return durationStrings{d.Handler.WithAttrs(conv)}
}

func (d durationStrings) WithGroup(name string) slog.Handler {
	return durationStrings{d.Handler.WithGroup(name)}
}

func durationAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindDuration:
		return slog.String(a.Key, v.Duration().String())
	case slog.KindGroup:
		g := v.Group()
		conv := make([]any, len(g))
		for i, ga := range g {
			conv[i] = durationAttr(ga)
		}
		return slog.Group(a.Key, conv...)
	}
	return a
}

// VersionCmd prints the version.
type VersionCmd struct{}

// Run prints the version to stdout.
func (VersionCmd) Run(env *Env) error {
	fmt.Fprintf(env.Stdout, "knotless-run %s\n", version.Version)
	return nil
}

// unknownCommand catches a mistyped command: serve is the default
// command and takes repositories as arguments, so without this a word
// like "lgoin" would be read as a repository. A repository has a "/"
// (OWNER/NAME or an AT-URI); a word without one, where serve was not
// typed, is a command that does not exist, and the error names the
// nearest one (by edit distance).
func unknownCommand(parser *kong.Kong, kctx *kong.Context, args, repos []string) error {
	if !strings.HasPrefix(kctx.Command(), "serve") {
		return nil
	}
	for _, r := range repos {
		if strings.Contains(r, "/") {
			continue
		}
		i := slices.Index(args, r)
		if i < 0 || slices.Contains(args[:i], "serve") || slices.Contains(args[:i], "--") {
			continue
		}
		best, dist := "", -1
		for _, c := range parser.Model.Children {
			if c.Hidden {
				continue
			}
			for _, name := range append([]string{c.Name}, c.Aliases...) {
				if d := editDistance(r, name); dist < 0 || d < dist {
					best, dist = name, d
				}
			}
		}
		msg := fmt.Sprintf("unknown command %q", r)
		if dist >= 0 && dist <= max(2, len(r)/3) {
			msg += fmt.Sprintf("; did you mean %q?", best)
		}
		return errors.New(msg + " (knotless-run --help lists the commands)")
	}
	return nil
}

// editDistance is the Levenshtein distance of a and b, with a swap of
// two neighbours counting one (lgoin is one from login).
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range y {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}
