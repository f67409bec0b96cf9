package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// user is someone at a terminal: their own configuration directory
// (XDG_CONFIG_HOME), typing knotless-run commands.
type user struct {
	t      *testing.T
	config string
	plc    string
}

func newUser(t *testing.T, plc string) *user {
	return &user{t: t, config: t.TempDir(), plc: plc}
}

// run runs a command line as the user types it, with stdin.
func (u *user) run(ctx context.Context, stdin string, args ...string) result {
	u.t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(ctx, args, Env{
		Stdin: strings.NewReader(stdin), Stdout: &stdout, Stderr: &stderr,
		Getenv: func(k string) string {
			switch k {
			case "XDG_CONFIG_HOME":
				return u.config
			case "PATH":
				return os.Getenv("PATH")
			}
			return ""
		},
	})
	return result{code, stdout.String(), stderr.String()}
}

func (u *user) sessionFile() string { return filepath.Join(u.config, "knotless-run", "session.json") }

// startWorld starts a PDS with an owner, a runner and the owner's
// repository.
func startWorld(t *testing.T) (*pds.Server, *forgeworld.World) {
	t.Helper()
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv, forgeworld.New(t, srv, forgeworld.Options{App: "serve"})
}

// TestLoginWritesRecords: login takes the app password on stdin (never
// argv), keeps only the session, 0600 in a 0700 directory; cancel then
// writes its record with it; --print prints it instead; logout removes
// the session.
func TestLoginWritesRecords(t *testing.T) {
	t.Parallel()
	srv, w := startWorld(t)
	ctx := context.Background()
	password, err := w.Owner.AppPassword(ctx, "cli")
	if err != nil {
		t.Fatal(err)
	}
	u := newUser(t, srv.PLCURL)
	subject := forge.Subject{Repo: w.RepoURI.String(), Commit: strings.Repeat("a", 40), Ref: "refs/heads/main",
		Event: "at://" + w.Owner.DID.String() + "/dev.knotless.refUpdate/3n3pa7x34wk22", Kind: forge.KindPush}
	key := forge.CheckKey(subject, "build")
	check := w.Put(w.Runner, forge.CollectionCheck, key, forge.Check{Type: forge.CollectionCheck, Subject: subject,
		Workflow: "build", Status: forge.StatusQueued, CreatedAt: forge.Now()}).String()

	if r := u.run(ctx, "", "cancel", check); r.code == ExitSuccess || !strings.Contains(r.stderr, "not logged in") {
		t.Errorf("cancel before login: exit %d, stderr %q; want it to ask for login", r.code, r.stderr)
	}
	r := u.run(ctx, password+"\n", "login", w.Owner.DID.String(), "--plc-url", srv.PLCURL)
	if r.code != ExitSuccess {
		t.Fatalf("login: exit %d\n%s", r.code, r.stderr)
	}
	assertMode(t, u.sessionFile(), 0o600)
	assertMode(t, filepath.Dir(u.sessionFile()), 0o700|fs.ModeDir)
	b, err := os.ReadFile(u.sessionFile())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), password) {
		t.Error("the session file holds the app password")
	}
	var s savedSession
	if err := json.Unmarshal(b, &s); err != nil || s.AccountDID != w.Owner.DID || s.PLCURL != srv.PLCURL {
		t.Errorf("session %s: %v", b, err)
	}

	// runs lists the check; its key's first characters name it.
	r = u.run(ctx, "", "runs")
	if r.code != ExitSuccess || !strings.Contains(r.stdout, key) || !strings.Contains(r.stdout, "queued") || !strings.Contains(r.stdout, "push main aaaaaaa") {
		t.Errorf("runs: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = u.run(ctx, "", "runs", "--json", "--repo", forgeworld.RepoName, "--status", "queued")
	var views []runView
	if err := json.Unmarshal([]byte(r.stdout), &views); err != nil || len(views) != 1 || views[0].URI != check {
		t.Errorf("runs --json: %v, %+v\n%s", err, views, r.stderr)
	}
	if r := u.run(ctx, "", "runs", "--json", "--status", "success"); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("runs --status success: %q", r.stdout)
	}

	r = u.run(ctx, "", "cancel", key[:6], "--no-wait")
	if r.code != ExitSuccess {
		t.Fatalf("cancel: exit %d\n%s", r.code, r.stderr)
	}
	var rec forge.Cancel
	ckey := forge.CancelKey("", key)
	if _, err := w.Reader.Get(ctx, syntax.ATURI("at://"+w.Owner.DID.String()+"/"+forge.CollectionCancel+"/"+ckey), &rec); err != nil || rec.Repo != w.RepoURI.String() {
		t.Fatalf("the cancel record is not on the PDS: %v %+v\n%s", err, rec, r.stderr)
	}

	r = u.run(ctx, "", "cancel", check, "--print")
	if r.code != ExitSuccess || !strings.Contains(r.stdout, `"$type": "dev.knotless.cancel"`) {
		t.Errorf("cancel --print: exit %d, stdout %q", r.code, r.stdout)
	}

	// The shell's completion offers the check's key (kongplete, the
	// predictor reading what runs lists).
	if got := completeAs(t, u.config, "knotless-run watch "); !strings.Contains(got, key) {
		t.Errorf("completion of watch CHECK offers %q, not the check %s", got, key)
	}

	if r := u.run(ctx, "", "logout"); r.code != ExitSuccess {
		t.Errorf("logout: exit %d\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(u.sessionFile()); !os.IsNotExist(err) {
		t.Errorf("the session is still there after logout: %v", err)
	}
}

func assertMode(t *testing.T, name string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (fs.ModePerm | fs.ModeDir); got != want {
		t.Errorf("%s: mode %v, want %v", name, got, want)
	}
}

// TestRunControlFromTheTerminal drives run control as a user types it,
// against a real PDS and serve with the shell executor: log in, a push,
// runs lists it, watch follows a run and exits with its result, cancel
// stops a running step and says so, rerun --failed starts attempt 2,
// dispatch -f runs with the input, a stranger's cancel is refused with
// the rule, and no password or token is anywhere but the 0600 session.
func TestRunControlFromTheTerminal(t *testing.T) {
	t.Parallel()
	srv, w := startWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ownerPassword, err := w.Owner.AppPassword(ctx, "cli")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := srv.CreateAccount(ctx, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	strangerPassword, err := stranger.AppPassword(ctx, "cli")
	if err != nil {
		t.Fatal(err)
	}

	work := t.TempDir()
	w.Push(map[string]string{
		".knotless/workflows/build.yaml":  "on: [push]\nsteps:\n  - name: greet\n    run: echo hello from build\n  - name: env\n    run: tr '\\0' '\\n' < /proc/$$/environ > " + work + "/step-environ; tr '\\0' ' ' < /proc/$$/cmdline > " + work + "/step-cmdline\n",
		".knotless/workflows/flaky.yaml":  "on: [push]\nsteps:\n  - name: flake\n    run: if [ -f " + work + "/flaked ]; then echo fine now; else touch " + work + "/flaked; echo flaking; exit 3; fi\n",
		".knotless/workflows/slow.yaml":   "on: [push]\nsteps:\n  - name: sleep\n    run: touch " + work + "/slow-started; sleep 120\n",
		".knotless/workflows/deploy.yaml": "on:\n  dispatch:\n    inputs:\n      target: {type: choice, options: [staging, production], required: true}\nsteps:\n  - name: deploy\n    run: echo \"deploying to $target\" > " + work + "/deployed\n",
	})

	// The runner: serve with the shell executor, its live output on a
	// listener of its own.
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "app-password")
	writeFile(t, pwFile, w.Password+"\n")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	cfgFile := filepath.Join(dir, "config.json")
	writeFile(t, cfgFile, fmt.Sprintf(`{"executor": "shell", "did": %q, "pds": %q, "plc-url": %q, "state-dir": %q, "cache-dir": %q,
  "shell-root": %q, "poll": "300ms", "app-password-file": %q, "concurrency": 4, "listen": %q,
  "allow-local-sources": true}`,
		w.Runner.DID, srv.URL, srv.PLCURL, filepath.Join(dir, "state"), filepath.Join(dir, "cache"), t.TempDir(), pwFile, listen))
	daemon := exec.Command(os.Args[0], "-test.run=^TestServeHelperProcess$", "--", "--config", cfgFile, w.Owner.DID.String()+"/"+forgeworld.RepoName)
	daemon.Env = append(os.Environ(), "KNOTLESS_SERVE_HELPER=1")
	logs := &syncbuf.Buffer{}
	daemon.Stdout, daemon.Stderr = logs, logs
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = daemon.Process.Kill(); _ = daemon.Wait() })

	owner := newUser(t, srv.PLCURL)
	if r := owner.run(ctx, ownerPassword+"\n", "login", w.Owner.DID.String(), "--plc-url", srv.PLCURL); r.code != ExitSuccess {
		t.Fatalf("login: exit %d\n%s", r.code, r.stderr)
	}

	// runs lists the push's checks.
	keys := map[string]string{}
	waitFor(t, 90*time.Second, func() bool {
		r := owner.run(ctx, "", "runs", "--json")
		var views []runView
		if json.Unmarshal([]byte(r.stdout), &views) != nil {
			return false
		}
		for _, v := range views {
			keys[v.Workflow] = v.Key
		}
		return len(keys) == 3
	}, logs.String)
	r := owner.run(ctx, "", "runs")
	for _, wf := range []string{"build", "flaky", "slow"} {
		if !strings.Contains(r.stdout, wf) || !strings.Contains(r.stdout, keys[wf]) {
			t.Errorf("runs does not list %s:\n%s", wf, r.stdout)
		}
	}

	// watch follows a run to its end and exits with its result.
	r = owner.run(ctx, "", "watch", "--exit-status", keys["build"][:8])
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "hello from build") || !strings.Contains(r.stdout, "success build") {
		t.Errorf("watch build: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	// Watching a run that has ended shows its log, from the check's blob.
	r = owner.run(ctx, "", "watch", "--exit-status", keys["build"])
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "hello from build") || !strings.Contains(r.stdout, "success build") {
		t.Errorf("watch build once ended: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = owner.run(ctx, "", "watch", "--exit-status", keys["flaky"])
	if r.code != ExitFailure || !strings.Contains(r.stdout, "failure flaky") {
		t.Errorf("watch flaky: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, ExitFailure, r.stdout, r.stderr)
	}

	// cancel stops the running step and says so.
	waitFor(t, 60*time.Second, func() bool { _, err := os.Stat(filepath.Join(work, "slow-started")); return err == nil }, logs.String)
	r = owner.run(ctx, "", "cancel", keys["slow"])
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "Cancelled slow") {
		t.Errorf("cancel: exit %d\nstdout:\n%s\nstderr:\n%s\n%s", r.code, r.stdout, r.stderr, logs.String())
	}

	// rerun --failed starts attempt 2 and prints its check.
	r = owner.run(ctx, "", "rerun", "--failed", "--env", "DEBUG=1", keys["build"])
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "Re-running flaky (attempt 2)") || strings.Contains(r.stdout, "build (attempt") {
		t.Errorf("rerun --failed: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	key2 := strings.TrimSpace(r.stdout[strings.LastIndex(r.stdout, ": ")+2:])
	if r := owner.run(ctx, "", "watch", "--exit-status", key2); r.code != ExitSuccess || !strings.Contains(r.stdout, "attempt 2") {
		t.Errorf("watch attempt 2 (%s): exit %d\nstdout:\n%s\nstderr:\n%s", key2, r.code, r.stdout, r.stderr)
	}

	// dispatch -f runs the workflow with the input.
	r = owner.run(ctx, "", "dispatch", "--repo", forgeworld.RepoName, "--ref", "main", "--workflow", "deploy", "-f", "target=staging")
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "Dispatched deploy") {
		t.Fatalf("dispatch: exit %d\nstdout:\n%s\nstderr:\n%s\n%s", r.code, r.stdout, r.stderr, logs.String())
	}
	dkey := strings.Fields(r.stdout[strings.LastIndex(r.stdout, ": ")+2:])[0]
	if r := owner.run(ctx, "", "watch", "--exit-status", dkey); r.code != ExitSuccess {
		t.Errorf("watch the dispatch: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(work, "deployed")); err != nil || string(b) != "deploying to staging\n" {
		t.Errorf("the dispatched run wrote %q, %v", b, err)
	}

	// A stranger's cancel is refused, naming the rule, and writes nothing.
	other := newUser(t, srv.PLCURL)
	if r := other.run(ctx, strangerPassword+"\n", "login", stranger.DID.String(), "--plc-url", srv.PLCURL); r.code != ExitSuccess {
		t.Fatalf("login as the stranger: exit %d\n%s", r.code, r.stderr)
	}
	r = other.run(ctx, "", "cancel", w.Runner.DID.String()+"/"+dkey)
	if r.code == ExitSuccess || !strings.Contains(r.stderr, "refused: not the repository's owner") {
		t.Errorf("a stranger's cancel: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if recs, _, _ := pdsclient.List[forge.Cancel](ctx, w.Reader, stranger.DID, forge.CollectionCancel); len(recs) != 0 {
		t.Errorf("the stranger's refused cancel was written: %v", recs)
	}

	// No password or token anywhere but the 0600 sessions.
	secrets := map[string]string{"the owner's app password": ownerPassword, "the stranger's app password": strangerPassword}
	for _, u := range []*user{owner, other} {
		var s savedSession
		b, _ := os.ReadFile(u.sessionFile())
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		secrets["an access token"], secrets["a refresh token"] = s.AccessToken, s.RefreshToken
		assertMode(t, u.sessionFile(), 0o600)
		scanFor(t, secrets, map[string]bool{owner.sessionFile(): true, other.sessionFile(): true},
			filepath.Dir(dir), "/proc/self/cmdline", "/proc/self/environ",
			fmt.Sprintf("/proc/%d/cmdline", daemon.Process.Pid), fmt.Sprintf("/proc/%d/environ", daemon.Process.Pid))
	}
	if _, err := os.Stat(filepath.Join(work, "step-environ")); err != nil {
		t.Errorf("the step that dumps its environment did not run: %v", err)
	}
}

// scanFor fails the test for any of secrets found in a file under paths
// but those allowed.
func scanFor(t *testing.T, secrets map[string]string, allowed map[string]bool, paths ...string) {
	t.Helper()
	check := func(name string) {
		if allowed[name] {
			return
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return
		}
		for what, s := range secrets {
			if s != "" && bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds %s", name, what)
			}
		}
	}
	for _, p := range paths {
		_ = filepath.WalkDir(p, func(name string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				check(name)
			}
			return nil
		})
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			check(p)
		}
	}
}

// completeAs asks the program for the completions of line, as bash's
// complete -C does: the program run with COMP_LINE set.
func completeAs(t *testing.T, config, line string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeHelperProcess$", "--")
	cmd.Env = append(os.Environ(), "KNOTLESS_SERVE_HELPER=1", "COMP_LINE="+line, fmt.Sprintf("COMP_POINT=%d", len(line)), "XDG_CONFIG_HOME="+config)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("complete %q: %v\n%s", line, err, out)
	}
	return string(out)
}

// TestCompletion: commands and flags complete (kongplete), and each
// shell gets its hook.
func TestCompletion(t *testing.T) {
	t.Parallel()
	config := t.TempDir()
	if got := completeAs(t, config, "knotless-run wat"); strings.TrimSpace(got) != "watch" {
		t.Errorf("knotless-run wat<TAB>: %q, want watch", got)
	}
	if got := completeAs(t, config, "knotless-run runs --st"); !strings.Contains(got, "--status") {
		t.Errorf("knotless-run runs --st<TAB>: %q", got)
	}
	for shell, want := range map[string]string{"bash": "complete -C", "zsh": "bashcompinit", "fish": "complete -f -c knotless-run"} {
		if r := runCLI(t, nil, "completion", shell); r.code != ExitSuccess || !strings.Contains(r.stdout, want) {
			t.Errorf("completion %s: exit %d, %q", shell, r.code, r.stdout)
		}
	}
}

// TestCompletionFromRuns: a CHECK completes with the keys runs lists
// for the --repo typed on the line (another owner's repository too),
// else of the logged-in account's repositories; --repo completes with
// the names of the account's repositories.
func TestCompletionFromRuns(t *testing.T) {
	t.Parallel()
	srv, w := startWorld(t)
	ctx := context.Background()
	password, err := w.Owner.AppPassword(ctx, "cli")
	if err != nil {
		t.Fatal(err)
	}
	other, err := srv.CreateAccount(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	otherRepo := forge.RepoURI(other.DID, "proj")
	w.Put(other, forge.CollectionRepo, "proj", forge.Repo{Type: forge.CollectionRepo, Name: "proj", Source: "https://127.0.0.1:1/proj.git",
		DefaultBranch: "main", Runners: []string{w.Runner.DID.String()}, CreatedAt: forge.Now()})
	check := func(repo syntax.ATURI, owner syntax.DID) string {
		s := forge.Subject{Repo: repo.String(), Commit: strings.Repeat("b", 40), Ref: "refs/heads/main",
			Event: "at://" + owner.String() + "/dev.knotless.refUpdate/3n3pa7x34wk22", Kind: forge.KindPush}
		key := forge.CheckKey(s, "build")
		w.Put(w.Runner, forge.CollectionCheck, key, forge.Check{Type: forge.CollectionCheck, Subject: s,
			Workflow: "build", Status: forge.StatusQueued, CreatedAt: forge.Now()})
		return key
	}
	own, others := check(w.RepoURI, w.Owner.DID), check(otherRepo, other.DID)

	u := newUser(t, srv.PLCURL)
	if r := u.run(ctx, password+"\n", "login", w.Owner.DID.String(), "--plc-url", srv.PLCURL); r.code != ExitSuccess {
		t.Fatalf("login: exit %d\n%s", r.code, r.stderr)
	}
	for _, tt := range []struct {
		line           string
		want, unwanted string
	}{
		{"knotless-run watch ", own, others},
		{"knotless-run watch --repo " + other.DID.String() + "/proj ", others, own},
		{"knotless-run cancel --repo=" + otherRepo.String() + " ", others, own},
		{"knotless-run logs --repo " + forgeworld.RepoName + " " + own[:3], own, others},
		{"knotless-run runs --repo ", forgeworld.RepoName, "proj"},
		{"knotless-run dispatch --repo h", forgeworld.RepoName, "proj"},
	} {
		got := completeAs(t, u.config, tt.line)
		if !strings.Contains(got, tt.want) || strings.Contains(got, tt.unwanted) {
			t.Errorf("%s<TAB>: %q; want %s offered, not %s", tt.line, got, tt.want, tt.unwanted)
		}
	}
}
