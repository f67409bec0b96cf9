// Package status is what `knotless-run status` shows: a JSON document
// of what the runner is doing (its runs going with their step and age,
// the queue, owed checks, handed-over runs, credentials' expiry, why it
// is degraded), served by the running daemon over HTTP (GET /status, on a
// unix socket in its state directory) and, when no daemon answers, made
// from its state.json.
//
// The daemon implements Provider; Handler serves it, Listen makes the
// socket. Fetch asks a daemon and says ErrNotRunning when none answers;
// FromState reads what a stopped daemon left.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"knotless.dev/run/internal/parts/state"
)

// Version is the document's format.
const Version = 1

// Path is where the daemon serves the document.
const Path = "/status"

// SocketName is the daemon's socket, in its state directory.
const SocketName = "status.sock"

// Where a document comes from.
const (
	FromDaemon    = "daemon" // the running daemon answered
	FromStateFile = "state"  // no daemon answered: its state.json
)

// Doc is the runner's status.
type Doc struct {
	Version int    `json:"version"`
	Source  string `json:"source"`
	// At is when the document was made.
	At time.Time `json:"at"`
	// Daemon describes the process that answered; nil from state.json.
	Daemon *Daemon `json:"daemon,omitempty"`
	// Runs are the runs going (from state.json: those the last process
	// left, handed over or to run again).
	Runs []Run `json:"runs"`
	// Queued is the work waiting for a worker; null from state.json (the
	// queue lives in the daemon's memory).
	Queued []Queued `json:"queued"`
	// Owed are final checks the PDS has not taken yet.
	Owed []Owed `json:"owed"`
	// Credentials are the credentials whose expiry is known.
	Credentials []Credential `json:"credentials,omitempty"`
	// Degraded says why the runner cannot take runs now, one reason each.
	Degraded []string `json:"degraded,omitempty"`
	// Replicas are the runner's live processes as this one sees them
	// (serve --replicas); nil for one process.
	Replicas *Replicas `json:"replicas,omitempty"`
}

// Replicas is this process's view of the runner's replicas.
type Replicas struct {
	Self string    `json:"self"`
	Live []Replica `json:"live"`
}

// Replica is a live replica: its name, the process holding it and its
// Lease's last renewal.
type Replica struct {
	Name       string    `json:"name"`
	Invocation string    `json:"invocation,omitempty"`
	Renewed    time.Time `json:"renewed"`
}

// Daemon is the process that answered.
type Daemon struct {
	PID      int       `json:"pid"`
	Version  string    `json:"version"`
	Started  time.Time `json:"started"`
	Executor string    `json:"executor"`
	Runner   string    `json:"runner"` // its DID
	Ready    bool      `json:"ready"`
	Stopping bool      `json:"stopping,omitempty"`
}

// Run is one run going.
type Run struct {
	Check    string    `json:"check"`
	RunID    string    `json:"run"`
	Workflow string    `json:"workflow"`
	Kind     string    `json:"kind,omitempty"`
	Event    string    `json:"event"`
	Commit   string    `json:"commit"`
	Started  time.Time `json:"startedAt"`
	// Step is the step going, from 1 (0: none yet), of Steps; StepName
	// its name; StepStarted when it started.
	Step        int       `json:"step,omitempty"`
	Steps       int       `json:"steps,omitempty"`
	StepName    string    `json:"stepName,omitempty"`
	StepStarted time.Time `json:"stepStartedAt,omitzero"`
	// Session is the executor's session (executor.Ref's string).
	Session string `json:"session,omitempty"`
	// Adopted: a stopped process handed it over and this one took it.
	Adopted bool `json:"adopted,omitempty"`
	// HandedOver: from state.json, the run was left going for the next
	// process to adopt; a run left without a handover runs again.
	HandedOver bool `json:"handedOver,omitempty"`
}

// Queued is work waiting for a worker.
type Queued struct {
	Check    string    `json:"check"`
	Workflow string    `json:"workflow"`
	Kind     string    `json:"kind,omitempty"`
	Event    string    `json:"event"`
	Commit   string    `json:"commit"`
	Since    time.Time `json:"since"`
}

// Owed is a final check the PDS has not taken yet.
type Owed struct {
	Check     string    `json:"check"`
	Event     string    `json:"event"`
	Since     time.Time `json:"since"`
	Tries     int       `json:"tries"`
	LastError string    `json:"lastError,omitempty"`
}

// Credential is a credential's expiry.
type Credential struct {
	Name    string    `json:"name"` // "kubernetes": the executor's token
	Expires time.Time `json:"expires"`
}

// Provider is the running daemon's side: what it is doing now. The
// handler fills Version, Source and (when zero) At.
type Provider interface {
	Status(ctx context.Context) Doc
}

// Handler serves p's document at Path (GET or HEAD).
func Handler(p Provider) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, r *http.Request) {
		doc := p.Status(r.Context())
		doc.Version, doc.Source = Version, FromDaemon
		if doc.At.IsZero() {
			doc.At = time.Now().UTC()
		}
		// A daemon knows its queue: none is an empty list, not null
		// (which says unknown, from state.json).
		if doc.Runs == nil {
			doc.Runs = []Run{}
		}
		if doc.Queued == nil {
			doc.Queued = []Queued{}
		}
		if doc.Owed == nil {
			doc.Owed = []Owed{}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(doc)
	})
	return mux
}

// Listen makes the daemon's socket at path, mode 0600 (the state
// directory's owner alone asks it; the directory itself is 0700). A socket an earlier process left is
// replaced; one a live daemon answers on, or another file, is an error
// naming it.
func Listen(path string) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("status socket %s: %w", path, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("status socket %s: a file that is not a socket is there", path)
	default:
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("status socket %s: another daemon answers on it (two daemons on one --state-dir?)", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("status socket %s: remove the one an earlier process left: %w", path, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("status socket: %w", err)
	}
	return l, nil
}

// ErrNotRunning says no daemon answered: there is no socket, or nothing
// listens on it.
var ErrNotRunning = errors.New("no daemon answers")

// Fetch asks the daemon listening on the unix socket at path.
func Fetch(ctx context.Context, path string) (Doc, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
	defer client.CloseIdleConnections()
	doc, err := FetchURL(ctx, client, "http://knotless-run"+Path)
	if err != nil {
		return Doc{}, fmt.Errorf("status socket %s: %w", path, err)
	}
	return doc, nil
}

// FetchURL asks the daemon at url (its Path on a listener of its own).
// Nothing listening there (connection refused, no socket) is
// ErrNotRunning.
func FetchURL(ctx context.Context, client *http.Client, url string) (Doc, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Doc{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, fs.ErrNotExist) {
			return Doc{}, fmt.Errorf("%w: %v", ErrNotRunning, err)
		}
		return Doc{}, fmt.Errorf("ask the daemon: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Doc{}, fmt.Errorf("ask the daemon: %s: %s", resp.Status, b)
	}
	var doc Doc
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&doc); err != nil {
		return Doc{}, fmt.Errorf("read the daemon's answer: %w", err)
	}
	if doc.Version != Version {
		return Doc{}, fmt.Errorf("the daemon's status has version %d; this knotless-run reads version %d", doc.Version, Version)
	}
	return doc, nil
}

// SocketPath is the socket of the daemon whose state directory is dir.
func SocketPath(dir string) string { return filepath.Join(dir, SocketName) }

// FromState is the status a stopped daemon left in st (its state.json):
// the runs it left (handed over, or to run again) and the checks it
// owes. What lived only in its memory (the queue, credentials, why it
// was degraded) is not there.
func FromState(st *state.State, at time.Time) Doc {
	doc := Doc{Version: Version, Source: FromStateFile, At: at.UTC(), Runs: []Run{}, Owed: []Owed{}}
	for key, r := range st.Runs {
		run := Run{Check: key, RunID: r.RunID, Workflow: r.Workflow, Event: r.Event, Commit: r.Commit, Started: r.StartedAt}
		if h := r.Handover; h != nil {
			run.HandedOver = true
			run.Session = h.Session.String()
			run.Steps = len(h.Steps)
			run.Step = h.Step + 1
			if h.Step >= 0 && h.Step < len(h.Steps) {
				run.StepName = h.Steps[h.Step].Name
			}
			if h.Started {
				run.StepStarted = h.StepStartedAt
			}
		}
		doc.Runs = append(doc.Runs, run)
	}
	sort.Slice(doc.Runs, func(i, j int) bool {
		a, b := doc.Runs[i], doc.Runs[j]
		return a.Started.Before(b.Started) || a.Started.Equal(b.Started) && a.Check < b.Check
	})
	for key, o := range st.Owed {
		doc.Owed = append(doc.Owed, Owed{Check: key, Event: o.Event, Since: o.Since, Tries: o.Tries, LastError: o.LastError})
	}
	sort.Slice(doc.Owed, func(i, j int) bool {
		a, b := doc.Owed[i], doc.Owed[j]
		return a.Since.Before(b.Since) || a.Since.Equal(b.Since) && a.Check < b.Check
	})
	return doc
}
