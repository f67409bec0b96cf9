package cli

import (
	"context"
	"encoding/json"
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

// fakeDaemon answers status requests with doc.
type fakeDaemon struct{ doc status.Doc }

func (f fakeDaemon) Status(context.Context) status.Doc { return f.doc }

func daemonDoc(now time.Time) status.Doc {
	return status.Doc{
		At:     now,
		Daemon: &status.Daemon{PID: 4242, Version: "1.2.3", Started: now.Add(-2 * time.Hour), Executor: "kubernetes", Runner: "did:plc:runner", Ready: true},
		Runs: []status.Run{{Check: "k1", RunID: "r1", Workflow: "build", Kind: "push", Event: "at://did:plc:o/dev.knotless.refUpdate/3k",
			Commit: "0123456789abcdef0123", Started: now.Add(-5 * time.Minute), Step: 2, Steps: 3, StepName: "test",
			StepStarted: now.Add(-90 * time.Second), Adopted: true}},
		Queued:      []status.Queued{{Check: "k2", Workflow: "lint", Kind: "pull", Event: "at://did:plc:p/dev.knotless.pull/1", Commit: "fedcba", Since: now.Add(-time.Minute)}},
		Owed:        []status.Owed{{Check: "k3", Event: "e3", Since: now.Add(-10 * time.Minute), Tries: 4, LastError: "429 Too Many Requests"}},
		Credentials: []status.Credential{{Name: "kubernetes", Expires: now.Add(45 * time.Minute)}},
		Degraded:    []string{"executor degraded: cluster unreachable"},
	}
}

// serveStatus serves doc on the socket of state directory dir, as the
// daemon does, until the test ends.
func serveStatus(t *testing.T, dir string, doc status.Doc) {
	t.Helper()
	l, err := status.Listen(status.SocketPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: status.Handler(fakeDaemon{doc})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
}

// TestStatusOfARunningDaemon: status asks the daemon on its socket and
// prints its runs with their step and age, the queue, owed checks, the
// credential's expiry and why it is degraded; --json prints the
// document.
func TestStatusOfARunningDaemon(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Now().UTC().Truncate(time.Second)
	serveStatus(t, dir, daemonDoc(now))

	r := runCLI(t, nil, "status", "--state-dir", dir)
	if r.code != 0 {
		t.Fatalf("status: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{
		"daemon: ready, pid 4242, knotless-run 1.2.3, up 2h0m0s, executor kubernetes, runner did:plc:runner",
		"degraded: executor degraded: cluster unreachable",
		"credential kubernetes: expires " + now.Add(45*time.Minute).Format(time.RFC3339) + " (in 45m0s)",
		"runs going: 1",
		"2/3 test (adopted)",
		"1m30s", "5m0s", "at://did:plc:o/dev.knotless.refUpdate/3k@0123456789ab",
		"queued: 1", "lint", "at://did:plc:p/dev.knotless.pull/1@fedcba",
		"owed checks: 1", "429 Too Many Requests", "10m0s",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}

	r = runCLI(t, nil, "status", "--state-dir", dir, "--json")
	var got status.Doc
	if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil {
		t.Fatalf("status --json: exit %d, %v, stdout %q, stderr %q", r.code, err, r.stdout, r.stderr)
	}
	want := daemonDoc(now)
	want.Version, want.Source = status.Version, status.FromDaemon
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status --json (-want +got):\n%s", diff)
	}
}

// TestStatusOverURL: --url asks a daemon's HTTP listener instead.
func TestStatusOverURL(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(status.Handler(fakeDaemon{daemonDoc(time.Now())}))
	defer srv.Close()
	r := runCLI(t, nil, "status", "--state-dir", t.TempDir(), "--url", srv.URL+status.Path)
	if r.code != 0 || !strings.Contains(r.stdout, "daemon: ready, pid 4242") {
		t.Errorf("status --url: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestStatusOfAStoppedDaemon: no daemon answers (no socket, or a socket
// a killed daemon left), so status reads state.json, written by
// internal/parts/state, without changing it: the runs left (handed over or to
// run again) and the owed checks; the queue is unknown.
func TestStatusOfAStoppedDaemon(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	started := time.Now().Add(-20 * time.Minute).UTC()
	st := state.New()
	st.Runs = map[string]state.Run{
		"k1": {CheckKey: "k1", RunID: "r1", Workflow: "build", Event: "e1", Commit: "c1", StartedAt: started,
			Handover: &run.Handover{Session: executor.Ref{Executor: "kubernetes", RunID: "r1", Namespace: "runs", Name: "knotless-r1"},
				Step: 0, Started: true, StepStartedAt: started.Add(time.Minute), Steps: []run.StepResult{{Name: "compile"}, {Name: "test"}}}},
		"k2": {CheckKey: "k2", RunID: "r2", Workflow: "lint", Event: "e2", Commit: "c2", StartedAt: started.Add(time.Minute)},
	}
	st.Owed = map[string]state.Owed{"k3": {Check: json.RawMessage(`{}`), Event: "e3", Since: started, Tries: 2, LastError: "502 Bad Gateway"}}
	if err := st.Save(dir); err != nil {
		t.Fatal(err)
	}
	stateFile := filepath.Join(dir, state.StateFile)
	before, err := os.ReadFile(stateFile)
	if err != nil {
		t.Fatal(err)
	}
	fiBefore, _ := os.Stat(stateFile)

	check := func(name string) {
		t.Helper()
		r := runCLI(t, nil, "status", "--state-dir", dir)
		if r.code != 0 {
			t.Fatalf("%s: exit %d, stderr %q", name, r.code, r.stderr)
		}
		for _, want := range []string{
			"daemon: not running (no answer at " + status.SocketPath(dir) + "); what the last one left in " + stateFile,
			"runs left: 2 (1 handed over, adopted at the next start; the others run again)",
			"1/2 compile (handed over)", "r2",
			"queued: unknown",
			"owed checks: 1", "502 Bad Gateway",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("%s: output lacks %q:\n%s", name, want, r.stdout)
			}
		}
		r = runCLI(t, nil, "status", "--state-dir", dir, "--json")
		var doc status.Doc
		if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || doc.Source != status.FromStateFile || doc.Daemon != nil || len(doc.Runs) != 2 || doc.Queued != nil {
			t.Errorf("%s: --json: %v %+v", name, err, doc)
		}
	}
	check("no socket")

	// A socket a daemon killed with -9 left, nobody listening on it.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: status.SocketPath(dir), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	check("stale socket")

	after, err := os.ReadFile(stateFile)
	fiAfter, _ := os.Stat(stateFile)
	if err != nil || string(after) != string(before) || !fiAfter.ModTime().Equal(fiBefore.ModTime()) {
		t.Errorf("status changed state.json: %v", err)
	}
}

// TestStatusWithACorruptStateFile names the file.
func TestStatusWithACorruptStateFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, state.StateFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "status", "--state-dir", dir)
	if r.code != ExitError || !strings.Contains(r.stderr, filepath.Join(dir, state.StateFile)) || !strings.Contains(r.stderr, "no daemon answers") {
		t.Errorf("exit %d, stderr %q; want an error naming state.json", r.code, r.stderr)
	}
}

// TestStatusEscapesStrangersStrings: workflow and step names, events and
// errors are strangers'; an escape sequence in one (OSC 52 sets the
// clipboard, CSI 2J clears the screen) is shown, not acted on, in the
// table and in --json.
func TestStatusEscapesStrangersStrings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Now().UTC().Truncate(time.Second)
	doc := daemonDoc(now)
	doc.Runs[0].Workflow = "build\x1b]52;c;cm0gLXJmIH4K\x07"
	doc.Runs[0].StepName = "test\x1b[2J\x1b[H"
	doc.Runs[0].Event = "at://did:plc:o/dev.knotless.refUpdate/\u202e3k"
	doc.Queued[0].Workflow = "lint\r\x1b[31mfake\x1b[0m\tcolumn"
	doc.Owed[0].LastError = "429\x1b]0;title\x07 \u009b2J"
	doc.Degraded = []string{"degraded\x1bc"}
	serveStatus(t, dir, doc)

	r := runCLI(t, nil, "status", "--state-dir", dir)
	if r.code != 0 {
		t.Fatalf("status: exit %d, stderr %q", r.code, r.stderr)
	}
	if strings.ContainsAny(r.stdout, "\x1b\x07\r\u202e\u009b") {
		t.Errorf("status prints a control a terminal acts on:\n%q", r.stdout)
	}
	for _, want := range []string{
		`build\x1b]52;c;cm0gLXJmIH4K\x07`, `2/3 test\x1b[2J\x1b[H (adopted)`, `refUpdate/\u202e3k`,
		`lint\x0d\x1b[31mfake\x1b[0m\x09column`, `429\x1b]0;title\x07 \u009b2J`, `degraded: degraded\x1bc`,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}

	r = runCLI(t, nil, "status", "--state-dir", dir, "--json")
	if r.code != 0 || strings.ContainsAny(r.stdout, "\x1b\x07\r\u202e\u009b") {
		t.Errorf("status --json: exit %d, prints a control a terminal acts on:\n%q", r.code, r.stdout)
	}
	var got status.Doc
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	doc.Version, doc.Source = status.Version, status.FromDaemon
	if diff := cmp.Diff(doc, got); diff != "" {
		t.Errorf("status --json is not the document (-want +got):\n%s", diff)
	}
}
