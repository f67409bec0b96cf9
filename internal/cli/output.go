package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/termsafe"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/output/outputservice"
)

// OutputServiceCmd is the output service: it takes runs' output pushed
// by the runners it is configured for and serves it to readers.
type OutputServiceCmd struct {
	Listen     string   `help:"Address to serve HTTP on (put a TLS proxy in front of it for runners elsewhere). (default ${default})" default:"127.0.0.1:8789" placeholder:"ADDR"`
	DataDir    string   `help:"Directory where runs' output and files are kept." required:"" placeholder:"DIR"`
	Runners    []string `name:"runner" help:"A runner DID whose output is taken; repeat for each runner. Any other is refused." required:"" placeholder:"DID"`
	ServiceDID string   `name:"service-did" help:"The service's own DID: the audience the runners' service-auth tokens must name." required:"" placeholder:"DID"`
	PLCURL     string   `name:"plc-url" help:"The did:plc directory to resolve the runners' DIDs (their signing keys) with. (default ${default})" default:"https://plc.directory" placeholder:"URL"`

	Retention        time.Duration `help:"How long a run's output and files are kept after the run ended (or after its last put, when it never ended)." default:"168h"`
	MaxRunOutput     int64         `help:"Bytes of each run's output kept: its first and its last half of them, the middle of a longer log cut (live subscribers see it all). (default ${default})" default:"16777216" placeholder:"BYTES"`
	MaxRunsPerRunner int           `help:"Runs kept per runner; one that ended goes first to make room, and a new run is refused while all are live. (default ${default})" default:"256" placeholder:"N"`
	MaxRunFiles      int           `help:"Output files kept per run. (default ${default})" default:"100" placeholder:"N"`
	MaxRunFileBytes  int64         `help:"Bytes of output files kept per run, all files together. (default ${default})" default:"67108864" placeholder:"BYTES"`
	MaxSubscribers   int           `help:"Readers following runs at once, all runs together. (default ${default})" default:"4096" placeholder:"N"`
}

// Run serves until SIGTERM or SIGINT.
func (c *OutputServiceCmd) Run(ctx context.Context, env *Env) error {
	log := env.Logger.With("component", "output-service")
	if c.MaxRunOutput < 2 || c.MaxRunsPerRunner < 1 || c.MaxRunFiles < 0 || c.MaxRunFileBytes < 0 || c.MaxSubscribers < 1 || c.Retention <= 0 {
		return usageError{errors.New("output-service: --max-run-output, --max-runs-per-runner, --max-subscribers and --retention must be positive")}
	}
	for _, r := range c.Runners {
		if _, err := syntax.ParseDID(r); err != nil {
			return usageError{fmt.Errorf("--runner %q: %w", r, err)}
		}
	}
	if _, err := syntax.ParseDID(c.ServiceDID); err != nil {
		return usageError{fmt.Errorf("--service-did %q: %w", c.ServiceDID, err)}
	}
	store, err := output.OpenStore(output.StoreConfig{
		Dir:              c.DataDir,
		Limits:           output.Limits{Head: c.MaxRunOutput / 2, Tail: c.MaxRunOutput - c.MaxRunOutput/2},
		MaxRunsPerRunner: c.MaxRunsPerRunner,
		MaxFiles:         c.MaxRunFiles,
		MaxFileBytes:     c.MaxRunFileBytes,
		Retention:        c.Retention,
		MaxSubscribers:   c.MaxSubscribers,
		Logger:           log,
	})
	if err != nil {
		return fmt.Errorf("--data-dir %s: %w", c.DataDir, err)
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		return err
	}
	svc, err := outputservice.New(outputservice.Config{
		ServiceDID: c.ServiceDID,
		Runners:    c.Runners,
		Directory:  pdsclient.NewDirectory(pdsclient.DirectoryConfig{PLCURL: c.PLCURL}),
		Store:      store,
		Catalog:    cat,
		Logger:     log,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", c.Listen, err)
	}
	log.Info("serving run output", "listen", ln.Addr().String(), "service_did", c.ServiceDID, "runners", len(c.Runners), "runs", store.Len())
	return svc.Serve(ctx, ln)
}

// LogsCmd prints a check's output, and with --follow follows it live.
type LogsCmd struct {
	ClientFlags `embed:""`
	Follow      bool   `short:"f" help:"Follow the output while the run goes on, to its end (a queued check is waited for until its run starts); the exit code is then the run's (0 success, 1 failure, 2 error, 130 cancelled)."`
	From        string `help:"Read from this runner listener or output service (its base URL) (default: where the check record's live field says)." placeholder:"URL"`
	Repo        string `help:"Where to look for a check named by its key: at://OWNER-DID/dev.knotless.repo/NAME, OWNER-DID/NAME, or NAME, one of yours (default: every repository of the account you logged in as)." placeholder:"REPO" predictor:"repo"`
	Check       string `arg:"" help:"The check: at://RUNNER/dev.knotless.check/KEY, RUNNER/KEY, or its key or a unique prefix of it, as knotless-run runs shows it." predictor:"check"`
}

// Help is logs --help's text below its usage line.
func (LogsCmd) Help() string {
	return "The output is the run's, written by whoever wrote its workflow: on a terminal it is shown as text and colours " +
		"only (other escape sequences and controls, which could set the clipboard or rewrite the screen, are dropped, " +
		"and a carriage return alone starts a new line); to a pipe or a file its bytes are written as they are."
}

// Run prints the output to stdout: filtered for a terminal
// (termsafe.Writer), as it is to anything else.
func (c *LogsCmd) Run(ctx context.Context, env *Env) error {
	ref, err := parseCheckRef(c.Check)
	if err != nil {
		return err
	}
	check := ref.URI
	base := c.From
	if base == "" || check == "" {
		f, fc, err := resolveOne(ctx, env, &c.ClientFlags, c.Repo, c.Check)
		if err != nil {
			return err
		}
		check = fc.URI
		if base == "" {
			if base, err = liveService(ctx, env, f, fc, c.Follow); err != nil {
				return err
			}
		}
	}
	client := &outputhttp.Client{Base: base}
	out := env.Stdout
	if terminal(env.Stdout) {
		filter := termsafe.NewWriter(env.Stdout)
		defer filter.Flush()
		out = filter
	}
	var end *output.End
	if c.Follow {
		end, err = followLogs(ctx, client, check.String(), out, env.Logger)
	} else {
		end, err = printLogs(ctx, client, check.String(), out)
	}
	if err != nil {
		return err
	}
	if end != nil && c.Follow {
		fmt.Fprintf(env.Stderr, "knotless-run: run ended: %s\n", termsafe.Line(end.Status))
		if code := statusCode(run.Status(end.Status)); code != ExitSuccess {
			return exitError{code: code}
		}
	}
	return nil
}

// pollEvery is how often a command waiting on a check reads its record
// again.
const pollEvery = 500 * time.Millisecond

// liveService is where the check's output is read, from its record's
// live field. With wait, a check still queued (its run not started, so
// no live field yet) is read again until its run starts.
func liveService(ctx context.Context, env *Env, f *finder, fc foundCheck, wait bool) (string, error) {
	said := false
	for {
		if fc.Check.Live != nil && fc.Check.Live.Service != "" {
			return fc.Check.Live.Service, nil
		}
		if !wait || fc.Check.Final() {
			return "", fmt.Errorf("check %s says nowhere where its output is read (no live field: the runner serves no live output, or the check is %s); give --from URL", fc.URI, termsafe.Line(fc.Check.Status))
		}
		if !said {
			env.Logger.Info("the check is queued; waiting for its run to start", "check", fc.URI.String())
			said = true
		}
		select {
		case <-ctx.Done():
			return "", exitError{code: ExitCancelled}
		case <-time.After(pollEvery):
		}
		next, err := f.get(ctx, fc.URI)
		if err != nil {
			return "", err
		}
		fc = next
	}
}

// cutLine is what a reader prints for bytes not kept, as the log blob
// says it.
func cutLine(n int64) string {
	return fmt.Sprintf("\n[knotless-run: %d bytes cut from the middle of this log]\n", n)
}

// printLogs prints what the host has of the output now.
func printLogs(ctx context.Context, c *outputhttp.Client, check string, w io.Writer) (*output.End, error) {
	off := int64(0)
	for {
		out, err := c.Get(ctx, check, off, outputhttp.MaxGetLimit)
		if err != nil {
			return nil, err
		}
		if out.Offset > off {
			fmt.Fprint(w, cutLine(out.Offset-off))
		}
		if _, err := w.Write(out.Data); err != nil {
			return nil, err
		}
		off = out.Offset + int64(len(out.Data))
		if off >= out.Size {
			if out.Final {
				return &output.End{Size: out.Size, Status: out.Status}, nil
			}
			return nil, nil
		}
	}
}

// followLogs follows the output to its end, coming back from the offset
// it reached when the connection drops; it waits for output that is
// not there yet.
func followLogs(ctx context.Context, c *outputhttp.Client, check string, w io.Writer, log *slog.Logger) (*output.End, error) {
	off := int64(0)
	run := ""
	backoff := 250 * time.Millisecond
	waiting := false
	for {
		var end *output.End
		err := c.Resume(ctx, check, run, off, func(ev outputhttp.Event) error {
			backoff = 250 * time.Millisecond
			switch {
			case ev.Run != nil:
				if run != "" && ev.Run.Run != run {
					// Its runner lost the run followed and runs the work
					// again: the new run's output follows from its start.
					log.Warn("the run followed was replaced by a new run of the check (its runner lost it); its output follows from the start", "run", run, "new_run", ev.Run.Run)
					off = 0
				}
				run = ev.Run.Run
			case ev.Gap != nil:
				fmt.Fprint(w, cutLine(ev.Gap.Next-ev.Gap.Offset))
				off = ev.Gap.Next
			case ev.Chunk != nil:
				if _, err := w.Write(ev.Chunk.Data); err != nil {
					return err
				}
				off = ev.Chunk.Offset + int64(len(ev.Chunk.Data))
			case ev.End != nil:
				end = ev.End
			}
			return nil
		})
		if end != nil {
			return end, nil
		}
		if ctx.Err() != nil {
			return nil, exitError{code: ExitCancelled}
		}
		switch {
		case outputhttp.IsError(err, "RunNotFound"):
			if !waiting {
				log.Info("no output of the check yet; waiting for it", "check", check)
				waiting = true
			}
		case outputhttp.IsError(err, "FutureCursor"), outputhttp.IsError(err, "InvalidRequest"):
			return nil, err
		default:
			log.Warn("the output stream broke; following again", "offset", off, "err", err, "in", backoff)
		}
		select {
		case <-ctx.Done():
			return nil, exitError{code: ExitCancelled}
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}
