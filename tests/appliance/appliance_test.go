// Package appliance_test runs knotless-run as the NixOS module's own
// units under a real systemd (a throwaway systemd-nspawn machine from
// tests/systemd), against a real PDS (tests/pds) and, for the Kubernetes
// executor, the test cluster (tests/cluster).
//
// The units are the module's, rendered by tests/nix/render-units.sh into
// tests/nix/golden (tests/nix/check.sh fails when the module's evaluation
// and those copies disagree). Only the store paths are replaced: the
// package by the binary built from this checkout, git and coreutils by the
// machine's /usr, the settings file by the test's.
package appliance_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
	systemdtest "knotless.dev/run/tests/systemd"
)

// srv is the PDS every test shares; binary is knotless-run built from
// this checkout.
var (
	srv    *pds.Server
	binary []byte
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() || os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "tests/appliance: SKIPPED under -short or when not root: these tests boot a real systemd (systemd-nspawn) and start a real PDS")
		os.Exit(m.Run())
	}
	code, err := setup(m)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tests/appliance: %v\n", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "knotless-appliance-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "knotless-run")
	build := exec.Command("go", "build", "-o", bin, "./cmd/knotless-run")
	build.Dir = repoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("build knotless-run: %v\n%s", err, out)
	}
	if binary, err = os.ReadFile(bin); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if srv, err = pds.Start(ctx, dir); err != nil {
		return 0, fmt.Errorf("start the test PDS: %w", err)
	}
	defer srv.Stop()
	return m.Run(), nil
}

// Where the machine finds what the test gives it.
const (
	optPath      = systemdtest.OptPath
	configPath   = optPath + "/knotless-run.json"
	srcMount     = "/srv/knotless-test-src" // the owner's git repository
	passwordPath = "/run/secrets/knotless-run/app-password"
)

var placeholder = regexp.MustCompile(`@[a-z-]+@`)

// unit reads a rendered unit of the module and puts this test's paths in
// place of the store paths.
func unit(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "tests", "nix", "golden", name))
	if err != nil {
		t.Fatalf("rendered unit: %v (tests/nix/render-units.sh tests/nix/golden)", err)
	}
	s := strings.NewReplacer(
		"@knotless-run@", optPath,
		"@config@", configPath,
		"@git@", "/usr",
		"@coreutils@", "/usr",
		// The golden shell runner lists nodejs in extraPackages.
		"@nodejs@", "/usr",
		// hostPackages' default, on the shell runner's PATH: Debian's
		// are in /usr.
		"@bash@", "/usr",
		"@findutils@", "/usr",
		"@diffutils@", "/usr",
		"@gnused@", "/usr",
		"@gnugrep@", "/usr",
		"@gawk@", "/usr",
		"@gnutar@", "/usr",
		"@gzip@", "/usr",
		"@bzip2@", "/usr",
		"@xz@", "/usr",
		"@gnumake@", "/usr",
		"@gnupatch@", "/usr",
	).Replace(string(b))
	if left := placeholder.FindString(s); left != "" {
		t.Fatalf("unit %s: store path placeholder %s is left", name, left)
	}
	return s
}

// world is the shared forge world (tests/forgeworld): an owner with a
// repository whose record names the runner, served from a real git
// repository bound into the machine at srcMount, and the runner's
// account.
type world struct {
	*forgeworld.World
	t *testing.T
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldAt(t, srcMount)
}

// newWorldAt is newWorld with the repository bound at mount instead, for
// a second world in one machine.
func newWorldAt(t *testing.T, mount string) *world {
	t.Helper()
	if srv == nil {
		t.Skip("tests/appliance: SKIPPED: no test PDS and no systemd machine under -short or when not root")
	}
	return &world{World: forgeworld.New(t, srv, forgeworld.Options{Source: "file://" + mount}), t: t}
}

// push commits files on main and writes the refUpdate.
func (w *world) push(files map[string]string) string {
	w.t.Helper()
	trimmed := map[string]string{}
	for name, content := range files {
		trimmed[name] = strings.TrimLeft(content, "\n")
	}
	_, commit := w.Push(trimmed)
	return commit
}

// checks lists the runner's check records of workflow on commit.
func (w *world) checks(workflow, commit string) []forge.Record[forge.Check] {
	w.t.Helper()
	recs, _, err := pdsclient.List[forge.Check](context.Background(), w.Reader, w.Runner.DID, forge.CollectionCheck)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []forge.Record[forge.Check]
	for _, r := range recs {
		if r.Value.Workflow == workflow && r.Value.Subject.Commit == commit {
			out = append(out, r)
		}
	}
	return out
}

// waitCheck waits until the check of workflow on commit has a status
// for which done is true.
func (w *world) waitCheck(workflow, commit string, timeout time.Duration, done func(forge.Check) bool) forge.Check {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		cs := w.checks(workflow, commit)
		if len(cs) > 1 {
			w.t.Fatalf("%d checks of %s on %s, want one", len(cs), workflow, commit)
		}
		if len(cs) == 1 && done(cs[0].Value) {
			return cs[0].Value
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("check of %s on %s: %+v after %s", workflow, commit, cs, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func final(c forge.Check) bool   { return c.Final() }
func running(c forge.Check) bool { return c.Status == forge.StatusRunning }

// settings are the daemon's settings file, as the module writes it from
// services.knotless-run.settings.
func (w *world) settings(extra map[string]any) []byte {
	s := map[string]any{
		"did":         w.Runner.DID.String(),
		"pds":         srv.URL,
		"plc-url":     srv.PLCURL,
		"executor":    "shell",
		"state-dir":   "/var/lib/knotless",
		"cache-dir":   "/var/cache/knotless",
		"stop-wait":   "2m",
		"poll":        "1s",
		"concurrency": 1,
		"discover":    true,
		// The test's repository is a local bare repository bound into
		// the machine.
		"allow-local-sources": true,
		// A throwaway machine: the shell executor may take discovered
		// repositories (the Kubernetes tests set executor and discover
		// themselves).
		"unsafe-shell-untrusted": true,
	}
	for k, v := range extra {
		s[k] = v
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

// appliance is the runner's machine: the module's units, the binary, the
// settings, the knotless user and the app password where the module's
// LoadCredential= takes it from.
type appliance struct {
	*systemdtest.Machine
	t *testing.T
}

const service = "knotless-run.service"

func boot(t *testing.T, w *world, units map[string]string, settings []byte, password string) *appliance {
	t.Helper()
	return bootWith(t, w, units, settings, password, nil)
}

// bootWith is boot with more systemd-nspawn binds, "HOST:GUEST".
func bootWith(t *testing.T, w *world, units map[string]string, settings []byte, password string, binds []string) *appliance {
	t.Helper()
	m := systemdtest.Boot(t, systemdtest.Options{
		Units: units,
		Files: map[string][]byte{"bin/knotless-run": binary, "knotless-run.json": settings},
		Binds: append([]string{w.Src.Dir + ":" + srcMount}, binds...),
	})
	a := &appliance{Machine: m, t: t}
	// What NixOS makes of users.users.knotless and of the operator's
	// secret files (sops, agenix), and git's check of the repository's
	// owner (root here; the daemon reads it as knotless).
	a.sh(`mkdir -p /etc/sysusers.d && echo 'u knotless - "knotless-run" /var/lib/knotless' > /etc/sysusers.d/knotless.conf && systemd-sysusers`)
	a.sh(`git config --system --add safe.directory '*'`)
	a.sh(`printf '127.0.0.1 localhost\n::1 localhost\n' > /etc/hosts`) // the volatile /etc has none
	a.sh(`install -d -m 0700 /run/secrets/knotless-run && umask 077 && printf '%s' "$1" > `+passwordPath, password)
	return a
}

// sh runs a shell script in the machine as root, failing the test on error.
func (a *appliance) sh(script string, args ...string) string {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := a.Exec(ctx, append([]string{"sh", "-c", script, "sh"}, args...)...)
	if err != nil {
		a.t.Fatal(err)
	}
	return string(out)
}

func (a *appliance) systemctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := a.Systemctl(ctx, args...)
	return string(out), err
}

func (a *appliance) show(unit, prop string) string {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := a.Show(ctx, unit, prop)
	if err != nil {
		a.t.Fatal(err)
	}
	return v
}

func (a *appliance) journal(unit string) []systemdtest.JournalEntry {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries, err := a.Journal(ctx, unit)
	if err != nil {
		a.t.Fatal(err)
	}
	return entries
}

// find returns the journal entries whose MESSAGE contains msg.
func find(entries []systemdtest.JournalEntry, msg string) []systemdtest.JournalEntry {
	var out []systemdtest.JournalEntry
	for _, e := range entries {
		if strings.Contains(e["MESSAGE"], msg) {
			out = append(out, e)
		}
	}
	return out
}

// blob downloads the log blob of a check.
func (w *world) blob(t *testing.T, c forge.Check) string {
	t.Helper()
	if c.Log == nil {
		t.Fatal("the check has no log blob")
	}
	b, err := w.Reader.GetBlob(context.Background(), w.Runner.DID, c.Log.Ref.String())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func strconvOctal(mode uint32) string { return strconv.FormatUint(uint64(mode), 8) }
