package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// parseServe parses args with the command tree Main uses.
func parseServe(t *testing.T, args ...string) (*CLI, *kong.Context, error) {
	t.Helper()
	var root CLI
	p, err := kong.New(&root, kong.Exit(func(int) { t.Fatal("exit") }), executorVars())
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := p.Parse(args)
	return &root, kctx, err
}

func TestServeConfigFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{
  "cache-dir": "/var/cache/knotless",
  "concurrency": 2,
  "did": "did:plc:7u2ld3ffgzqvezmv6wxgxiix",
  "executor": "shell",
  "namespace": "knotless-runs",
  "pds": "https://pds.example.com",
  "plc-url": "https://plc.example.com",
  "state-dir": "/var/lib/knotless",
  "stop-wait": "15m",
  "pulls": true,
  "log-format": "json",
  "image-pull-secret": ["ci-pull=registry.example.com/ci/*,untrusted", "team-pull=registry.example.com/team/*"],
  "egress-untrusted": "deny"
}`), 0o600); err != nil {
		t.Fatal(err)
	}
	root, kctx, err := parseServe(t, "--config", cfg, "--concurrency", "3", "--", "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello")
	if err != nil {
		t.Fatal(err)
	}
	if kctx.Command() != "serve <repo>" {
		t.Errorf("command %q", kctx.Command())
	}
	s := root.Serve
	got := fmt.Sprintf("%s %s %s %s %d %s %v %s %s %v", s.DID, s.Executor, s.PDS, s.PLCURL, s.Concurrency, s.StopWait, s.Pulls, s.Namespace, root.LogFormat, s.Repos)
	want := "did:plc:7u2ld3ffgzqvezmv6wxgxiix shell https://pds.example.com https://plc.example.com 3 15m0s true knotless-runs json [did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello]"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("flags (-want +got):\n%s", diff)
	}
	// A pull secret's ,untrusted is not a list separator.
	if diff := cmp.Diff([]string{"ci-pull=registry.example.com/ci/*,untrusted", "team-pull=registry.example.com/team/*"}, s.ImagePullSecret); diff != "" || s.EgressUntrusted != "deny" {
		t.Errorf("image-pull-secret (-want +got):\n%s\negress-untrusted %q", diff, s.EgressUntrusted)
	}

	// Without a command name, serve is the default.
	root, kctx, err = parseServe(t, "--config", cfg)
	if err != nil || !strings.HasPrefix(kctx.Command(), "serve") || root.Serve.StopWait != 15*time.Minute {
		t.Errorf("default command: %v %q %v", err, kctx.Command(), root.Serve.StopWait)
	}

	for name, body := range map[string]string{
		"unknown key":  `{"stopwait": "1m"}`,
		"app password": `{"app-password": "x"}`,
		"not json":     `{`,
	} {
		bad := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
		_ = os.WriteFile(bad, []byte(body), 0o600)
		if _, _, err := parseServe(t, "--config", bad); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestSecretSeal(t *testing.T) {
	t.Parallel()
	key, _, err := state.LoadKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	env := &Env{Stdin: strings.NewReader("tok'en\n"), Stdout: &stdout, Stderr: &stdout, Getenv: func(string) string { return "" }}
	c := SecretSealCmd{Runner: "did:plc:ewvi7nxzyoun6zhxrhs64oiz", Key: key.PublicString(), Repo: "at://did:plc:7u2ld3ffgzqvezmv6wxgxiix/dev.knotless.repo/hello", Name: "TOKEN"}
	if err := c.Run(env); err != nil {
		t.Fatal(err)
	}
	cat, _ := pdsclient.NewCatalog()
	var rec forge.Secret
	if err := cat.Decode(forge.CollectionSecret, []byte(stdout.String()), &rec); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	v, err := key.OpenSecret(rec, c.Repo, c.Runner)
	if err != nil || string(v) != "tok'en" {
		t.Fatalf("opened %q, %v", v, err)
	}
	if rec.Repo != c.Repo || rec.Name != "TOKEN" || rec.Runner != c.Runner || rec.Scope != forge.ScopePush {
		t.Errorf("record %+v", rec)
	}
	// The sealed bytes are bound to the repository: copied into another
	// repository's record, they do not open for its runs.
	other := "at://did:plc:vwzwgnygau7ed7b7wt5ux7y2/dev.knotless.repo/hello"
	copied := rec
	copied.Repo = other
	if v, err := key.OpenSecret(copied, other, c.Runner); err == nil {
		t.Errorf("the value opened for another repository: %q", v)
	}
	for _, repo := range []string{"did:plc:7u2ld3ffgzqvezmv6wxgxiix/hello", "at://alice.test/dev.knotless.repo/hello"} {
		bad := c
		bad.Repo = repo
		env.Stdin = strings.NewReader("tok'en\n")
		if err := bad.Run(env); err == nil || !strings.Contains(err.Error(), "--repo") {
			t.Errorf("--repo %s: sealed, want an error asking for at://DID/dev.knotless.repo/NAME", repo)
		}
	}
	if strings.Contains(stdout.String(), "tok'en") {
		t.Error("the value is in the output")
	}
}

// TestServeHelperProcess is the daemon process of TestServeHandover.
func TestServeHelperProcess(t *testing.T) {
	if os.Getenv("KNOTLESS_SERVE_HELPER") != "1" {
		t.Skip("helper process of TestServeHandover")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	env := Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	os.Exit(Main(context.Background(), args, env))
}

// TestServeHandover: SIGTERM during a run. The daemon says STOPPING=1
// and extends its timeout, releases the queued run, lets the started one
// finish within --stop-wait, and logs the handover; its successor runs
// the released work, and no work gets a second check.
func TestServeHandover(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	w := forgeworld.New(t, srv, forgeworld.Options{App: "serve"})
	owner, runner, password := w.Owner, w.Runner, w.Password
	marker := filepath.Join(t.TempDir(), "slow-started")
	w.Push(map[string]string{
		".knotless/workflows/build.yaml":  "on: [push]\nsteps:\n  - name: slow\n    run: touch " + marker + "; sleep 4; echo slow done\n",
		".knotless/workflows/report.yaml": "on: [push]\nsteps:\n  - name: quick\n    run: echo quick done\n",
	})

	dir := t.TempDir()
	pwFile := filepath.Join(dir, "app-password")
	writeFile(t, pwFile, password+"\n")
	cfgFile := filepath.Join(dir, "config.json")
	writeFile(t, cfgFile, fmt.Sprintf(`{"executor": "shell", "did": %q, "pds": %q, "plc-url": %q, "state-dir": %q, "cache-dir": %q,
  "shell-root": %q, "stop-wait": "1m", "poll": "300ms", "app-password-file": %q,
  "allow-local-sources": true}`,
		runner.DID, srv.URL, srv.PLCURL, filepath.Join(dir, "state"), filepath.Join(dir, "cache"), t.TempDir(), pwFile))

	sockName := filepath.Join(dir, "notify.sock")
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockName, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	notes := &notifications{}
	go notes.read(sock)

	start := func() (*exec.Cmd, *syncbuf.Buffer) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestServeHelperProcess$", "--", "--config", cfgFile, owner.DID.String()+"/hello")
		cmd.Env = append(os.Environ(), "KNOTLESS_SERVE_HELPER=1", "NOTIFY_SOCKET="+sockName)
		logs := &syncbuf.Buffer{}
		cmd.Stderr = logs
		cmd.Stdout = logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		return cmd, logs
	}
	first, logs1 := start()
	waitFor(t, 90*time.Second, func() bool { _, err := os.Stat(marker); return err == nil }, func() string { return logs1.String() })
	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first process: %v\n%s", err, logs1.String())
	}
	for _, want := range []string{"READY=1", "STATUS=", "STOPPING=1", "EXTEND_TIMEOUT_USEC="} {
		if !notes.has(want) {
			t.Errorf("sd_notify: no %s in %q", want, notes.all())
		}
	}
	if !strings.Contains(logs1.String(), "handed over 1 runs") {
		t.Errorf("first process log lacks the handover:\n%s", logs1.String())
	}

	cat, _ := pdsclient.NewCatalog()
	reader := &pdsclient.Reader{Dir: srv.Directory(), Catalog: cat}
	checks := func() map[string]forge.Check {
		recs, _, err := pdsclient.List[forge.Check](ctx, reader, runner.DID, forge.CollectionCheck)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]forge.Check{}
		for _, r := range recs {
			out[r.Value.Workflow] = r.Value
		}
		if len(recs) != len(out) {
			t.Errorf("%d checks for %d workflows", len(recs), len(out))
		}
		return out
	}
	got := checks()
	if got["build"].Status != "success" || got["report"].Status != "queued" {
		t.Fatalf("after the first process: build %s, report %s; want success, queued (released)\n%s", got["build"].Status, got["report"].Status, logs1.String())
	}

	second, logs2 := start()
	waitFor(t, 90*time.Second, func() bool { return checks()["report"].Status == "success" }, func() string { return logs2.String() })
	_ = second.Process.Signal(syscall.SIGTERM)
	_ = second.Wait()
	if got := checks(); len(got) != 2 || got["build"].Status != "success" {
		t.Errorf("after the second process: %+v", got)
	}
}

type notifications struct {
	mu   sync.Mutex
	msgs []string
}

func (n *notifications) read(c *net.UnixConn) {
	buf := make([]byte, 4096)
	for {
		k, err := c.Read(buf)
		if err != nil {
			return
		}
		n.mu.Lock()
		n.msgs = append(n.msgs, string(buf[:k]))
		n.mu.Unlock()
	}
}

func (n *notifications) has(prefix string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range n.msgs {
		for _, line := range strings.Split(m, "\n") {
			if strings.HasPrefix(line, prefix) {
				return true
			}
		}
	}
	return false
}

func (n *notifications) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s\n%s", timeout, logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
