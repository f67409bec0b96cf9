package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"knotless.dev/run/internal/lib/termsafe"
	"knotless.dev/run/internal/observe/status"
	"knotless.dev/run/internal/parts/state"
)

// StatusCmd shows what the running daemon is doing, or, when none
// answers, what the last one left in state.json.
type StatusCmd struct {
	StateDir string        `help:"The daemon's --state-dir: its status socket is there, and state.json, read when no daemon answers." default:"/var/lib/knotless" placeholder:"DIR"`
	Socket   string        `help:"The daemon's status socket (default: STATE_DIR/status.sock)." placeholder:"PATH"`
	URL      string        `help:"Ask the daemon over HTTP at URL (its /status on a listener of its own) instead of the socket." placeholder:"URL"`
	JSON     bool          `help:"Print the status document as JSON (for scripts): its source is daemon or state." name:"json"`
	Timeout  time.Duration `help:"How long to wait for the daemon's answer." default:"10s"`
}

// Run prints the status. A daemon that does not answer is not an error:
// the status is then read from state.json, and says so.
func (c *StatusCmd) Run(ctx context.Context, env *Env) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	where := c.Socket
	var doc status.Doc
	var err error
	switch {
	case c.URL != "":
		where = c.URL
		doc, err = status.FetchURL(ctx, http.DefaultClient, c.URL)
	default:
		if where == "" {
			where = status.SocketPath(c.StateDir)
			// The socket is in --state-dir: one that is not there is
			// said before a dial, whose error (a path too long for a
			// socket) would hide it.
			if err := c.missingStateDir(where); err != nil {
				return err
			}
		}
		doc, err = status.Fetch(ctx, where)
	}
	if errors.Is(err, status.ErrNotRunning) {
		if err := c.missingStateDir(where); err != nil {
			return err
		}
		st, lerr := state.Load(c.StateDir)
		if lerr != nil {
			return fmt.Errorf("no daemon answers at %s, and --state-dir %s: %w", where, c.StateDir, lerr)
		}
		doc, err = status.FromState(st, time.Now()), nil
	}
	if err != nil {
		return err
	}
	if c.JSON {
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return fmt.Errorf("encode the status: %w", err)
		}
		_, err = fmt.Fprintf(env.Stdout, "%s\n", termsafe.JSON(b))
		return err
	}
	printStatus(env.Stdout, doc, where, filepath.Join(c.StateDir, state.StateFile))
	return nil
}

// missingStateDir refuses a --state-dir that is not a directory: a
// mistyped flag, not an idle runner.
func (c *StatusCmd) missingStateDir(where string) error {
	if fi, err := os.Stat(c.StateDir); err != nil || !fi.IsDir() {
		return usageError{fmt.Errorf("--state-dir %s: not a directory (no daemon answers at %s, and there is no state.json to read): give the daemon's --state-dir", c.StateDir, where)}
	}
	return nil
}

// printStatus writes doc for a human. Its strings are the daemon's and
// strangers' (workflow and step names, events, errors of their PDS): each
// is shown escaped (termsafe.Line), so that none acts on the terminal or
// breaks the columns.
func printStatus(w io.Writer, doc status.Doc, where, stateFile string) {
	q := termsafe.Line
	now := doc.At
	age := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return now.Sub(t).Round(time.Second).String()
	}
	if d := doc.Daemon; d != nil {
		phase := "ready"
		switch {
		case d.Stopping:
			phase = "stopping"
		case !d.Ready:
			phase = "starting"
		}
		fmt.Fprintf(w, "daemon: %s, pid %d, knotless-run %s, up %s, executor %s, runner %s\n",
			phase, d.PID, q(d.Version), age(d.Started), q(d.Executor), q(d.Runner))
	} else {
		fmt.Fprintf(w, "daemon: not running (no answer at %s); what the last one left in %s:\n", q(where), q(stateFile))
	}
	if r := doc.Replicas; r != nil {
		names := make([]string, 0, len(r.Live))
		for _, m := range r.Live {
			names = append(names, q(m.Name))
		}
		fmt.Fprintf(w, "replica %s: %d live (%s)\n", q(r.Self), len(r.Live), strings.Join(names, ", "))
	}
	for _, r := range doc.Degraded {
		fmt.Fprintf(w, "degraded: %s\n", q(r))
	}
	for _, c := range doc.Credentials {
		left := c.Expires.Sub(now).Round(time.Second)
		if left > 0 {
			fmt.Fprintf(w, "credential %s: expires %s (in %s)\n", q(c.Name), c.Expires.UTC().Format(time.RFC3339), left)
		} else {
			fmt.Fprintf(w, "credential %s: EXPIRED at %s (%s ago)\n", q(c.Name), c.Expires.UTC().Format(time.RFC3339), -left)
		}
	}

	if doc.Source == status.FromStateFile {
		handed := 0
		for _, r := range doc.Runs {
			if r.HandedOver {
				handed++
			}
		}
		fmt.Fprintf(w, "\nruns left: %d (%d handed over, adopted at the next start; the others run again)\n", len(doc.Runs), handed)
	} else {
		fmt.Fprintf(w, "\nruns going: %d\n", len(doc.Runs))
	}
	if len(doc.Runs) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  RUN\tWORKFLOW\tKIND\tSTEP\tSTEP AGE\tAGE\tEVENT")
		for _, r := range doc.Runs {
			step := "-"
			if r.Step > 0 {
				step = fmt.Sprintf("%d/%d %s", r.Step, r.Steps, q(r.StepName))
			}
			var marks []string
			if r.Adopted {
				marks = append(marks, "adopted")
			}
			if r.HandedOver {
				marks = append(marks, "handed over")
			}
			if len(marks) > 0 {
				step += " (" + strings.Join(marks, ", ") + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s@%s\n", q(r.RunID), q(r.Workflow), q(orDash(r.Kind)), step, age(r.StepStarted), age(r.Started), q(r.Event), q(short(r.Commit)))
		}
		_ = tw.Flush()
	}

	if doc.Queued == nil {
		fmt.Fprintln(w, "queued: unknown (the queue lives in the daemon)")
	} else {
		fmt.Fprintf(w, "queued: %d\n", len(doc.Queued))
		if len(doc.Queued) > 0 {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  WORKFLOW\tKIND\tWAITING\tEVENT")
			for _, j := range doc.Queued {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s@%s\n", q(j.Workflow), q(orDash(j.Kind)), age(j.Since), q(j.Event), q(short(j.Commit)))
			}
			_ = tw.Flush()
		}
	}

	fmt.Fprintf(w, "owed checks: %d\n", len(doc.Owed))
	if len(doc.Owed) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CHECK\tTRIES\tOWED FOR\tLAST ERROR")
		for _, o := range doc.Owed {
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\n", q(o.Check), o.Tries, age(o.Since), q(orDash(o.LastError)))
		}
		_ = tw.Flush()
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// short is a commit's first 12 hex digits.
func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}
