package appliance_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const helloWorkflow = `
on: [push]
steps:
  - name: greet
    run: echo hello from the appliance
  - name: fail
    run: exit 3
`

// TestService: the module's unit of the shell runner under a real
// systemd: readiness after login, state and sweep; STATUS=; structured
// journal entries with their priorities; the app password only through
// LoadCredential=; a restart while a run goes on (the run finishes, one
// check); kill -9 (Restart=always; the shell executor cannot take the
// run up, so the started step is never run again: one error check).
func TestService(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := boot(t, w, map[string]string{service: unit(t, "knotless-run.shell.service")}, w.settings(nil), w.Password)
	if out, err := a.systemctl("start", service); err != nil {
		t.Fatalf("systemctl start: %v\n%s", err, out)
	}

	t.Run("readiness", func(t *testing.T) {
		if got := a.show(service, "ActiveState"); got != "active" {
			t.Fatalf("after systemctl start the unit is %s, want active", got)
		}
		// systemd made the unit active only after the daemon had logged
		// in, loaded its state and swept: READY=1, not the exec.
		started := a.monotonic(service, "ExecMainStartTimestampMonotonic")
		journal := a.journal(service)
		// The upper bound is systemd's own "Started" entry, not the unit's
		// ActiveEnterTimestamp: a journal entry is stamped when journald
		// reads it, which may be after systemd took READY=1; the daemon's
		// entry and systemd's reach journald through the same socket, in
		// the order they were sent.
		up := find(journal, "Started "+service)
		if len(up) == 0 {
			t.Fatalf("no %q in the journal", "Started "+service)
		}
		active, _ := strconv.ParseInt(up[0]["__MONOTONIC_TIMESTAMP"], 10, 64)
		for _, msg := range []string{"logged in", "made a sealing key pair"} {
			e := find(journal, msg)
			if len(e) == 0 {
				t.Fatalf("no %q in the journal", msg)
			}
			at, _ := strconv.ParseInt(e[0]["__MONOTONIC_TIMESTAMP"], 10, 64)
			if at < started || at > active {
				t.Errorf("%q logged at %d, want between the exec (%d) and systemd's Started entry (%d)", msg, at, started, active)
			}
		}
		if got := a.show(service, "StatusText"); got != "0 running, 0 queued" {
			t.Errorf("StatusText %q, want 0 running, 0 queued", got)
		}
	})

	t.Run("journal", func(t *testing.T) {
		commit := w.push(map[string]string{".knotless/workflows/hello.yaml": helloWorkflow})
		got := w.waitCheck("hello", commit, 2*time.Minute, final)
		if got.Status != "failure" || got.FailedStep != "fail" {
			t.Fatalf("check %s in %q (%s), want failure in step fail", got.Status, got.FailedStep, got.Error)
		}
		journal := a.journal(service)
		var greet, fail map[string]string
		for _, e := range find(journal, "step ended") {
			switch e["STEP"] {
			case "greet":
				greet = e
			case "fail":
				fail = e
			}
		}
		if greet == nil || fail == nil {
			t.Fatalf("no step ended entries for both steps in the journal")
		}
		for _, e := range []map[string]string{greet, fail} {
			for _, field := range []string{"RUN", "WORKFLOW", "STEP", "EXIT", "DURATION", "STATUS"} {
				if e[field] == "" {
					t.Errorf("step ended entry of %s has no %s field: %v", e["STEP"], field, e)
				}
			}
			if e["WORKFLOW"] != "hello" || e["_SYSTEMD_UNIT"] != service || e["SYSLOG_IDENTIFIER"] != "knotless-run" {
				t.Errorf("entry %v: want workflow hello from %s", e, service)
			}
		}
		if greet["EXIT"] != "0" || greet["PRIORITY"] != "6" || fail["EXIT"] != "3" || fail["STATUS"] != "failure" {
			t.Errorf("greet %s/%s prio %s, fail %s/%s; want exit 0 at info (6), exit 3 failure", greet["EXIT"], greet["STATUS"], greet["PRIORITY"], fail["EXIT"], fail["STATUS"])
		}
	})

	t.Run("credentials", func(t *testing.T) {
		pid := a.show(service, "MainPID")
		environ := a.sh(`tr '\0' '\n' < /proc/$1/environ`, pid)
		cmdline := a.sh(`tr '\0' ' ' < /proc/$1/cmdline`, pid)
		if !strings.Contains(environ, "CREDENTIALS_DIRECTORY=") {
			t.Errorf("no CREDENTIALS_DIRECTORY in the daemon's environment:\n%s", environ)
		}
		for what, text := range map[string]string{"environ": environ, "argv": cmdline} {
			if strings.Contains(text, w.Password) {
				t.Errorf("the app password is in the daemon's %s", what)
			}
		}
		units, err := os.ReadFile(filepath.Join(a.UnitsDir(), service))
		if err != nil || strings.Contains(string(units), w.Password) {
			t.Errorf("the app password is in the unit file (%v)", err)
		}
		if !strings.Contains(string(units), "LoadCredential=app-password:"+passwordPath) {
			t.Errorf("the unit does not load the app password as a credential")
		}
	})

	t.Run("restart mid-run", func(t *testing.T) {
		commit := w.push(map[string]string{".knotless/workflows/slow.yaml": `
on: [push]
steps:
  - name: slow
    run: |
      echo begun
      sleep 6
      echo finished
`})
		w.waitCheck("slow", commit, time.Minute, running)
		if got := a.show(service, "StatusText"); got != "1 running, 0 queued" {
			t.Errorf("StatusText during the run %q, want 1 running, 0 queued", got)
		}
		oldPID := a.show(service, "MainPID")
		if out, err := a.systemctl("restart", service); err != nil {
			t.Fatalf("systemctl restart: %v\n%s", err, out)
		}
		if pid := a.show(service, "MainPID"); pid == oldPID || a.show(service, "ActiveState") != "active" {
			t.Fatalf("after the restart: main PID %s (was %s), state %s", pid, oldPID, a.show(service, "ActiveState"))
		}
		got := w.waitCheck("slow", commit, 2*time.Minute, final)
		if got.Status != "success" {
			t.Fatalf("the run across the restart: %s (%s)", got.Status, got.Error)
		}
		journal := a.journal(service)
		if e := find(journal, "handed over 0 runs"); len(e) != 1 || e[0]["_PID"] != oldPID {
			t.Errorf("want the old process (%s) to log the handover once; got %v", oldPID, e)
		}
		if e := find(journal, "stopping: claiming nothing new"); len(e) == 0 || e[0]["RUNNING"] != "1" {
			t.Errorf("the stopping daemon did not log its going run: %v", e)
		}
	})

	t.Run("kill -9", func(t *testing.T) {
		marker := "/var/lib/knotless/first-attempt"
		commit := w.push(map[string]string{".knotless/workflows/killed.yaml": fmt.Sprintf(`
on: [push]
steps:
  - name: once
    run: |
      if [ ! -e %[1]s ]; then touch %[1]s; sleep 600; fi
      echo second attempt
`, marker)})
		w.waitCheck("killed", commit, time.Minute, running)
		for deadline := time.Now().Add(time.Minute); !strings.Contains(a.sh(`ls /var/lib/knotless`), "first-attempt"); {
			if time.Now().After(deadline) {
				t.Fatal("the step did not start")
			}
			time.Sleep(200 * time.Millisecond)
		}
		oldPID := a.show(service, "MainPID")
		a.sh(`kill -9 "$1"`, oldPID)
		deadline := time.Now().Add(time.Minute)
		for {
			if pid := a.show(service, "MainPID"); pid != "0" && pid != oldPID && a.show(service, "ActiveState") == "active" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Restart=always did not bring the daemon back: %s", a.show(service, "ActiveState"))
			}
			time.Sleep(200 * time.Millisecond)
		}
		if n := a.show(service, "NRestarts"); n != "1" {
			t.Errorf("NRestarts %s, want 1", n)
		}
		// The shell executor cannot take a run over: the step may have
		// done its work, so it is never started again; the check ends
		// error saying why.
		got := w.waitCheck("killed", commit, 2*time.Minute, final)
		if got.Status != "error" || !strings.Contains(got.Error, "runner restarted during step 1/1") || !strings.Contains(got.Error, "the shell executor cannot take a run over") {
			t.Fatalf("the killed run: %s (%s), want error: runner restarted during step 1/1", got.Status, got.Error)
		}
		if e := find(a.journal(service), "a run of a process that died cannot go on; its check ends error"); len(e) != 1 {
			t.Errorf("want the new process to log the run it ends once; got %v", e)
		}
		if blob := w.blob(t, got); strings.Contains(blob, "second attempt") {
			t.Errorf("the step was started again:\n%s", blob)
		}
	})

	t.Run("hardening", func(t *testing.T) {
		pid := a.show(service, "MainPID")
		status := a.sh(`grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/$1/status`, pid)
		for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000"} {
			if !strings.Contains(status, want) {
				t.Errorf("the daemon's /proc status lacks %q:\n%s", want, status)
			}
		}
		// In the daemon's own mount namespace: the system is read-only,
		// its state and cache directories are not.
		probe := `for d in /etc /usr /opt /var/lib /var/lib/knotless /var/cache/knotless; do
			if touch "$d/.knotless-probe" 2>/dev/null; then echo "$d writable"; rm -f "$d/.knotless-probe"; else echo "$d read-only"; fi
		done`
		got := a.sh(`nsenter -t "$1" -m sh -c "$2"`, pid, probe)
		want := "/etc read-only\n/usr read-only\n/opt read-only\n/var/lib read-only\n/var/lib/knotless writable\n/var/cache/knotless writable\n"
		if got != want {
			t.Errorf("writable paths in the daemon's view:\n%s\nwant:\n%s", got, want)
		}
		a.checkExposure(t, service)
	})

	t.Run("watchdog", func(t *testing.T) {
		// The module's WatchdogSec= is minutes; a drop-in makes it short
		// enough to watch the pings arrive.
		dropIn := filepath.Join(a.UnitsDir(), service+".d", "watchdog.conf")
		if err := os.MkdirAll(filepath.Dir(dropIn), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dropIn, []byte("[Service]\nWatchdogSec=2s\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"daemon-reload"}, {"restart", service}} {
			if out, err := a.systemctl(args...); err != nil {
				t.Fatalf("systemctl %v: %v\n%s", args, err, out)
			}
		}
		pid, restarts := a.show(service, "MainPID"), a.show(service, "NRestarts")
		first := a.monotonic(service, "WatchdogTimestampMonotonic")
		time.Sleep(5 * time.Second)
		if last := a.monotonic(service, "WatchdogTimestampMonotonic"); last <= first {
			t.Errorf("no WATCHDOG=1 in 5 s with WatchdogSec=2s (last ping at %d)", last)
		}
		if a.show(service, "MainPID") != pid || a.show(service, "NRestarts") != restarts {
			t.Errorf("the watchdog restarted the daemon")
		}
	})

	t.Run("no secret in the journal", func(t *testing.T) {
		for _, e := range a.journal("") {
			for k, v := range e {
				if strings.Contains(v, w.Password) {
					t.Errorf("the app password is in the journal, field %s of %v", k, e["MESSAGE"])
				}
			}
		}
	})
}

// TestFailedLogin: a daemon that cannot log in never becomes active;
// the unit fails its start and the journal says why, at error priority.
func TestFailedLogin(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := boot(t, w, map[string]string{service: unit(t, "knotless-run.shell.service")}, w.settings(nil), "wrong-password")
	out, err := a.systemctl("start", service)
	if err == nil {
		t.Fatalf("systemctl start succeeded with a wrong app password:\n%s", out)
	}
	if got := a.show(service, "ActiveState"); got == "active" {
		t.Fatalf("the unit is active")
	}
	var reason []string
	for _, e := range a.journal(service) {
		if strings.Contains(e["MESSAGE"], "log in") && e["PRIORITY"] == "3" {
			reason = append(reason, e["MESSAGE"])
		}
	}
	if len(reason) == 0 {
		t.Fatalf("no error-priority entry naming the login in the journal")
	}
	t.Logf("journal: %s", reason[0])
}

// exposure is systemd-analyze security's summary line.
var exposure = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)

// maxExposure is the target of docs/guide/nixos.md, which records the
// scores.
const maxExposure = 2.0

// checkExposure scores the unit with systemd-analyze security in the
// machine, as systemd sees the running unit.
func (a *appliance) checkExposure(t *testing.T, unit string) {
	t.Helper()
	out, _ := a.Exec(context.Background(), "systemd-analyze", "security", "--no-pager", unit)
	m := exposure.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no overall exposure in:\n%s", out)
	}
	level, _ := strconv.ParseFloat(string(m[1]), 64)
	t.Logf("systemd-analyze security %s: %.1f", unit, level)
	if level > maxExposure {
		t.Errorf("exposure of %s %.1f, want at most %.1f:\n%s", unit, level, maxExposure, out)
	}
}

// monotonic reads a unit's *TimestampMonotonic property (µs).
func (a *appliance) monotonic(unit, prop string) int64 {
	a.t.Helper()
	v, err := strconv.ParseInt(a.show(unit, prop), 10, 64)
	if err != nil || v == 0 {
		a.t.Fatalf("%s of %s: %q %v", prop, unit, a.show(unit, prop), err)
	}
	return v
}
