package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/tests/pds"
)

// Every flag of output-service and logs that has a default shows it in
// --help.
func TestOutputCommandsShowDefaults(t *testing.T) {
	t.Parallel()
	for name, cmd := range map[string]any{"output-service": OutputServiceCmd{}, "logs": LogsCmd{}} {
		help := runCLI(t, nil, name, "--help").stdout
		help = strings.Join(strings.Fields(help), " ")
		typ := reflect.TypeOf(cmd)
		for i := range typ.NumField() {
			f := typ.Field(i)
			def, ok := f.Tag.Lookup("default")
			if !ok {
				continue
			}
			if !strings.Contains(help, def) {
				t.Errorf("%s --help does not show the default of %s (%s)", name, f.Name, def)
			}
		}
	}
}

func TestOutputServiceFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		// A missing flag or a value of the wrong form is the command
		// line's fault (EX_CONFIG); an address that does not listen is not.
		{[]string{"--data-dir", dir, "--service-did", "did:web:out.test"}, "--runner", ExitConfig},
		{[]string{"--data-dir", dir, "--runner", "did:plc:x", "--service-did", "nope"}, "--service-did", ExitConfig},
		{[]string{"--data-dir", dir, "--runner", "bob", "--service-did", "did:web:out.test"}, "--runner", ExitConfig},
		{[]string{"--data-dir", dir, "--runner", "did:plc:x", "--service-did", "did:web:out.test", "--listen", "256.0.0.1:1"}, "--listen", ExitError},
	} {
		r := runCLI(t, nil, append([]string{"output-service"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d naming %s", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}

// output-service serves until it is stopped, then exits 0.
func TestOutputServiceServes(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"output-service", "--listen", addr, "--data-dir", t.TempDir(),
			"--runner", "did:plc:ewvi7nxzyoun6zhxrhs64oiz", "--service-did", "did:web:out.test", "--plc-url", "http://127.0.0.1:1"},
			Env{Stdout: &bytes.Buffer{}, Stderr: &stderr})
	}()
	for {
		resp, err := http.Get("http://" + addr + "/xrpc/_health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case code := <-done:
			t.Fatalf("output-service exited %d: %s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if code := <-done; code != ExitSuccess {
		t.Errorf("stopped output-service exited %d: %s", code, stderr.String())
	}
}

const logsCheck = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.check/zsvmur6bdrvdcvafwfoo7mmwp4"

func outputServer(t *testing.T) (*output.Hub, string) {
	t.Helper()
	hub := output.NewHub(output.HubConfig{Limits: output.Limits{Head: 4000, Tail: 1000, Marks: 100, Subscribers: 10}})
	h, err := outputhttp.New(outputhttp.Config{Source: hub})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return hub, srv.URL
}

// logs prints what the host has now; logs --follow follows the run to
// its end, comes back when the stream breaks, and exits with the run's
// status.
func TestLogs(t *testing.T) {
	t.Parallel()
	hub, url := outputServer(t)
	s, _ := hub.Open(logsCheck, "r")
	_, _ = s.Write([]byte("\x1b[31mred\x1b[0m line\n"))
	r := runCLI(t, nil, "logs", "--from", url, "did:plc:ewvi7nxzyoun6zhxrhs64oiz/zsvmur6bdrvdcvafwfoo7mmwp4")
	if r.code != ExitSuccess || r.stdout != "\x1b[31mred\x1b[0m line\n" {
		t.Errorf("logs: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	var want strings.Builder
	want.WriteString("\x1b[31mred\x1b[0m line\n")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for s.Watchers() == 0 {
			time.Sleep(time.Millisecond) // until logs -f follows
		}
		for i := range 300 {
			_, _ = s.Write([]byte(fmt.Sprintf("line %d\n", i)))
		}
		s.End("failure")
	}()
	for i := range 300 {
		want.WriteString(fmt.Sprintf("line %d\n", i))
	}
	r = runCLI(t, nil, "logs", "--follow", "--from", url, logsCheck)
	wg.Wait()
	if r.code != ExitFailure || r.stdout != want.String() || !strings.Contains(r.stderr, "run ended: failure") {
		t.Errorf("logs --follow: exit %d, %d bytes of %d, stderr %q", r.code, len(r.stdout), want.Len(), r.stderr)
	}

	// A log longer than the host keeps: the cut is said as the blob says it.
	s2, _ := hub.Open("at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.check/other", "r")
	_, _ = s2.Write([]byte(strings.Repeat("x", 8000)))
	s2.End("success")
	for _, follow := range []string{"--follow=false", "--follow"} {
		r = runCLI(t, nil, "logs", follow, "--from", url, "did:plc:ewvi7nxzyoun6zhxrhs64oiz/other")
		if r.code != ExitSuccess || !strings.Contains(r.stdout, "[knotless-run: 3000 bytes cut from the middle of this log]") || len(r.stdout) < 2000 {
			t.Errorf("logs %s of a cut stream: exit %d, stdout %d bytes: %q", follow, r.code, len(r.stdout), r.stdout[:min(len(r.stdout), 200)])
		}
	}

	for _, bad := range []string{"non sense", "at://did:plc:x/dev.knotless.pull/k"} {
		if r := runCLI(t, nil, "logs", "--from", url, bad); r.code != ExitConfig || !strings.Contains(r.stderr, "CHECK") {
			t.Errorf("logs %s: exit %d, stderr %q", bad, r.code, r.stderr)
		}
	}
}

// Without --from, logs reads where the check record's live field says
// its output is read (the record on a real PDS, found through the PLC).
func TestLogsFromTheCheckRecord(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	owner, runnerAcct, password, err := srv.OwnerAndRunner(ctx, "logs")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	acct, _, err := pdsclient.Login(ctx, pdsclient.LoginConfig{Host: srv.URL, Identifier: runnerAcct.DID.String(), Password: password}, cat)
	if err != nil {
		t.Fatal(err)
	}
	hub, url := outputServer(t)
	subject := forge.Subject{Repo: forge.RepoURI(owner.DID, "hello").String(), Commit: strings.Repeat("a", 40),
		Event: "at://" + owner.DID.String() + "/dev.knotless.refUpdate/3n3pa7x34wk22", Kind: forge.KindPush}
	key := forge.CheckKey(subject, "build")
	uri, err := acct.Put(ctx, forge.CollectionCheck, key, forge.Check{Type: forge.CollectionCheck, Subject: subject, Workflow: "build",
		Status: forge.StatusRunning, Live: &forge.LiveOutput{Service: url, Page: url + "/runs/" + acct.DID().String() + "/" + key}, CreatedAt: forge.Now()})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := hub.Open(uri.String(), "r")
	_, _ = s.Write([]byte("from the record's host\n"))
	r := runCLI(t, nil, "logs", "--plc-url", srv.PLCURL, uri.String())
	if r.code != ExitSuccess || r.stdout != "from the record's host\n" {
		t.Errorf("logs CHECK: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// logs --follow of a check still queued (no live field yet) waits for
// its run to start, then follows the live output the record names to
// the run's end (the record on a real PDS, found through the PLC).
func TestLogsFollowWaitsForAQueuedCheck(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	owner, runnerAcct, password, err := srv.OwnerAndRunner(ctx, "queued")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	acct, _, err := pdsclient.Login(ctx, pdsclient.LoginConfig{Host: srv.URL, Identifier: runnerAcct.DID.String(), Password: password}, cat)
	if err != nil {
		t.Fatal(err)
	}
	hub, url := outputServer(t)
	subject := forge.Subject{Repo: forge.RepoURI(owner.DID, "hello").String(), Commit: strings.Repeat("a", 40),
		Event: "at://" + owner.DID.String() + "/dev.knotless.refUpdate/3n3pa7x34wk22", Kind: forge.KindPush}
	key := forge.CheckKey(subject, "build")
	queued := forge.Check{Type: forge.CollectionCheck, Subject: subject, Workflow: "build", Status: forge.StatusQueued, CreatedAt: forge.Now()}
	uri, err := acct.Put(ctx, forge.CollectionCheck, key, queued)
	if err != nil {
		t.Fatal(err)
	}

	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"logs", "--follow", "--plc-url", srv.PLCURL, uri.String()}, Env{
			Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }})
	}()
	for !strings.Contains(stderr.String(), "waiting for its run to start") {
		select {
		case code := <-done:
			t.Fatalf("logs --follow of a queued check ended at once: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
		case <-ctx.Done():
			t.Fatalf("logs --follow never said it waits: %q", stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	// The run starts: its output opens, and the record says where it is.
	s, _ := hub.Open(uri.String(), "r")
	_, _ = s.Write([]byte("started after a wait\n"))
	running := queued
	running.Status, running.StartedAt = forge.StatusRunning, forge.Now()
	running.Live = &forge.LiveOutput{Service: url, Page: url + "/runs/" + acct.DID().String() + "/" + key}
	if _, err := acct.Put(ctx, forge.CollectionCheck, key, running); err != nil {
		t.Fatal(err)
	}
	for s.Watchers() == 0 {
		select {
		case code := <-done:
			t.Fatalf("logs --follow ended before following: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
		case <-time.After(time.Millisecond): // until logs -f follows
		}
	}
	_, _ = s.Write([]byte("live line\n"))
	s.End("success")
	if code := <-done; code != ExitSuccess || stdout.String() != "started after a wait\nlive line\n" || !strings.Contains(stderr.String(), "run ended: success") {
		t.Errorf("logs --follow of a queued check: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// logs --follow of a run its runner lost goes on with the new run of the
// check (the work run again) from its start, and says so on stderr.
func TestLogsFollowsTheNewRunOfTheCheck(t *testing.T) {
	t.Parallel()
	hub, url := outputServer(t)
	old, _ := hub.Open(logsCheck, "r1")
	_, _ = old.Write([]byte("the lost run's line\n"))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for old.Watchers() == 0 {
			time.Sleep(time.Millisecond) // until logs -f follows
		}
		again, _ := hub.Open(logsCheck, "r2")
		_, _ = again.Write([]byte("the new run's line\n"))
		again.End("success")
	}()
	r := runCLI(t, nil, "logs", "--follow", "--from", url, logsCheck)
	wg.Wait()
	if r.code != ExitSuccess || r.stdout != "the lost run's line\nthe new run's line\n" ||
		!strings.Contains(r.stderr, "replaced by a new run of the check") || !strings.Contains(r.stderr, "r2") {
		t.Errorf("logs --follow across a new run: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
