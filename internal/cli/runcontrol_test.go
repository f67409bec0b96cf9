package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
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

	r = u.run(ctx, "", "cancel", key[:6])
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
