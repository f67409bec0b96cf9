package status_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/observe/status"
	"knotless.dev/run/internal/parts/state"
)

// provider answers with doc.
type provider struct{ doc status.Doc }

func (p provider) Status(context.Context) status.Doc { return p.doc }

var t0 = time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)

func sampleDoc() status.Doc {
	return status.Doc{
		At:     t0,
		Daemon: &status.Daemon{PID: 4242, Version: "1.2.3", Started: t0.Add(-time.Hour), Executor: "kubernetes", Runner: "did:plc:runner", Ready: true},
		Runs: []status.Run{{Check: "at://did:plc:o/dev.knotless.refUpdate/3k@c1 build", RunID: "r1", Workflow: "build", Kind: "push",
			Event: "at://did:plc:o/dev.knotless.refUpdate/3k", Commit: "c1", Started: t0.Add(-5 * time.Minute),
			Step: 2, Steps: 3, StepName: "test", StepStarted: t0.Add(-time.Minute), Session: "kubernetes:runs/knotless-r1"}},
		Queued:      []status.Queued{{Check: "q", Workflow: "lint", Kind: "pull", Event: "at://did:plc:p/dev.knotless.pull/1", Commit: "c2", Since: t0.Add(-2 * time.Minute)}},
		Owed:        []status.Owed{{Check: "o", Event: "e", Since: t0.Add(-10 * time.Minute), Tries: 4, LastError: "429 Too Many Requests"}},
		Credentials: []status.Credential{{Name: "kubernetes", Expires: t0.Add(11 * time.Hour)}},
		Degraded:    []string{"executor degraded: cluster unreachable"},
	}
}

// TestHandlerAndFetch: the document a daemon serves on its socket is the
// one the client reads, marked as the daemon's.
func TestHandlerAndFetch(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), status.SocketName)
	l, err := status.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: status.Handler(provider{sampleDoc()})}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() {
		srv.Close()
		<-done
	}()
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode: %v %v, want 0600", fi.Mode(), err)
	}

	got, err := status.Fetch(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	want := sampleDoc()
	want.Version, want.Source = status.Version, status.FromDaemon
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fetched (-want +got):\n%s", diff)
	}
}

// TestHandlerOverHTTP: the same handler on a TCP listener (the metrics
// listener, say), read by URL; anything but GET or HEAD of Path is
// refused.
func TestHandlerOverHTTP(t *testing.T) {
	t.Parallel()
	doc := sampleDoc()
	doc.At = time.Time{} // the handler stamps it
	srv := httptest.NewServer(status.Handler(provider{doc}))
	defer srv.Close()
	got, err := status.FetchURL(context.Background(), srv.Client(), srv.URL+status.Path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Source != status.FromDaemon || got.At.IsZero() || len(got.Runs) != 1 || got.Runs[0].StepName != "test" {
		t.Errorf("fetched %+v", got)
	}
	// An idle daemon's empty lists are lists, not unknown.
	idle := httptest.NewServer(status.Handler(provider{status.Doc{Daemon: &status.Daemon{PID: 1}}}))
	defer idle.Close()
	empty, err := status.FetchURL(context.Background(), idle.Client(), idle.URL+status.Path)
	if err != nil || empty.Runs == nil || empty.Queued == nil || empty.Owed == nil {
		t.Errorf("an idle daemon's document: %+v, %v; want empty lists", empty, err)
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{http.MethodPost, status.Path, http.StatusMethodNotAllowed},
		{http.MethodGet, "/other", http.StatusNotFound},
		{http.MethodHead, status.Path, http.StatusOK},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("%s %s: %s, want %d", c.method, c.path, resp.Status, c.code)
		}
	}
	// The JSON names are what scripts read.
	resp, err := srv.Client().Get(srv.URL + status.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"version", "source", "at", "daemon", "runs", "queued", "owed", "credentials", "degraded"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("the document has no %q: %v", k, raw)
		}
	}
}

// TestFetchWithoutADaemon: no socket, and a socket nobody listens on (a
// daemon killed with -9 leaves it), both say ErrNotRunning.
func TestFetchWithoutADaemon(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := status.Fetch(context.Background(), filepath.Join(dir, "none.sock")); !errors.Is(err, status.ErrNotRunning) {
		t.Errorf("no socket: %v, want ErrNotRunning", err)
	}
	stale := staleSocket(t, dir)
	_, err := status.Fetch(context.Background(), stale)
	if !errors.Is(err, status.ErrNotRunning) || !strings.Contains(err.Error(), stale) {
		t.Errorf("stale socket: %v, want ErrNotRunning naming it", err)
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	if _, err := status.FetchURL(context.Background(), http.DefaultClient, srv.URL+status.Path); !errors.Is(err, status.ErrNotRunning) {
		t.Errorf("closed TCP port: %v, want ErrNotRunning", err)
	}
}

// staleSocket leaves a socket file nobody listens on.
func staleSocket(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	return path
}

// TestListen replaces a stale socket, and refuses a live one or a file
// that is not a socket.
func TestListen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stale := staleSocket(t, dir)
	l, err := status.Listen(stale)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := status.Listen(stale); err == nil || !strings.Contains(err.Error(), "another daemon") {
		t.Errorf("over a live socket: %v, want a refusal", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := status.Listen(file); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("over a file: %v, want a refusal", err)
	}
}

// TestFromState: what a stopped daemon left in a real state directory:
// a handed-over run with its step, a run to run again, an owed check.
func TestFromState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st := state.New()
	st.Runs = map[string]state.Run{
		"k2": {CheckKey: "k2", RunID: "r2", Workflow: "lint", Event: "e2", Commit: "c2", StartedAt: t0.Add(-time.Minute)},
		"k1": {CheckKey: "k1", RunID: "r1", Workflow: "build", Event: "e1", Commit: "c1", StartedAt: t0.Add(-10 * time.Minute),
			Handover: &run.Handover{
				Session: executor.Ref{Executor: "kubernetes", RunID: "r1", Namespace: "runs", Name: "knotless-r1"},
				Step:    1, Started: true, Offset: 100, StepStartedAt: t0.Add(-3 * time.Minute),
				Steps: []run.StepResult{{Name: "compile", Status: run.Success}, {Name: "test", Status: run.Skipped}, {Name: "pack", Status: run.Skipped}},
			}},
	}
	st.Owed = map[string]state.Owed{"k3": {Check: json.RawMessage(`{}`), Event: "e3", Since: t0.Add(-time.Hour), Tries: 7, LastError: "502 Bad Gateway"}}
	if err := st.Save(dir); err != nil {
		t.Fatal(err)
	}
	loaded, err := state.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := status.FromState(loaded, t0)
	want := status.Doc{
		Version: status.Version, Source: status.FromStateFile, At: t0,
		Runs: []status.Run{
			{Check: "k1", RunID: "r1", Workflow: "build", Event: "e1", Commit: "c1", Started: t0.Add(-10 * time.Minute),
				Step: 2, Steps: 3, StepName: "test", StepStarted: t0.Add(-3 * time.Minute), Session: "kubernetes:runs/knotless-r1", HandedOver: true},
			{Check: "k2", RunID: "r2", Workflow: "lint", Event: "e2", Commit: "c2", Started: t0.Add(-time.Minute)},
		},
		Owed: []status.Owed{{Check: "k3", Event: "e3", Since: t0.Add(-time.Hour), Tries: 7, LastError: "502 Bad Gateway"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("from state.json (-want +got):\n%s", diff)
	}
	// The queue is unknown there, not empty.
	b, _ := json.Marshal(got)
	if !strings.Contains(string(b), `"queued":null`) {
		t.Errorf("queued from state.json is not null: %s", b)
	}
}
