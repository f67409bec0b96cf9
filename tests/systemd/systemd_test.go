package systemdtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Scripts of the test units, in OptPath. systemd-notify runs in the main
// shell, so that the message comes from the service's main PID (systemd
// 252's systemd-notify sends as its parent when root).
var files = map[string][]byte{
	"notify.sh": []byte(`#!/bin/sh
while [ ! -e /opt/knotless-test/go ]; do sleep 0.1; done
systemd-notify --ready --status="serving knotless"
exec sleep infinity
`),
	"cred.sh": []byte(`#!/bin/sh
echo "credential token=$(cat "$CREDENTIALS_DIRECTORY/token") in $CREDENTIALS_DIRECTORY"
`),
	"log.sh": []byte(`#!/bin/sh
echo "<4>knotless warning"
printf 'MESSAGE=knotless structured\nKNOTLESS_RUN=run-42\nPRIORITY=3\nSYSLOG_IDENTIFIER=knotless-test\n' | logger --journald
`),
	"env.sh": []byte(`#!/bin/sh
echo "greeting=$KNOTLESS_GREETING"
`),
}

var units = map[string]string{
	"notify.service": `[Service]
Type=notify
NotifyAccess=all
TimeoutStartSec=10min
ExecStart=/opt/knotless-test/notify.sh
`,
	"cred.service": `[Service]
Type=oneshot
LoadCredential=token:/opt/knotless-test/token
ExecStart=/opt/knotless-test/cred.sh
`,
	"log.service": `[Service]
Type=oneshot
SyslogIdentifier=knotless-test
ExecStart=/opt/knotless-test/log.sh
`,
	"env.service": `[Service]
Type=oneshot
ExecStart=/opt/knotless-test/env.sh
`,
	"tick.timer": `[Timer]
OnActiveSec=1s
AccuracySec=1ms
`,
	"tick.service": `[Service]
Type=oneshot
ExecStart=/bin/sh -c 'date > /opt/knotless-test/ticked'
`,
}

const greeting = `hello "knotless" world`

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitJournal polls the unit's journal (the machine's when unit is "")
// until an entry satisfies ok, for a minute at most.
func waitJournal(ctx context.Context, t *testing.T, m *Machine, unit string, ok func(JournalEntry) bool) JournalEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		entries, err := m.Journal(ctx, unit)
		if err != nil {
			t.Fatalf("journal: %v", err)
		}
		for _, e := range entries {
			if ok(e) {
				return e
			}
		}
		select {
		case <-ctx.Done():
			var msgs []string
			for _, e := range entries {
				msgs = append(msgs, e["MESSAGE"])
			}
			t.Fatalf("no such journal entry of %q; messages:\n%s", unit, strings.Join(msgs, "\n"))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func TestMachine(t *testing.T) {
	t.Parallel()
	m := Boot(t, Options{Units: units, Files: files, Env: []string{"KNOTLESS_GREETING=" + greeting}})
	ctx := testContext(t)
	t.Logf("machine %s, PID 1 is %d on the host", m.Name(), m.Leader())

	t.Run("system", func(t *testing.T) {
		out, err := m.Systemctl(ctx, "is-system-running")
		if state := strings.TrimSpace(string(out)); state != "running" && state != "degraded" {
			t.Errorf("is-system-running: %q, %v", state, err)
		}
		running, err := m.Systemctl(ctx, "list-units", "--state=running", "--no-legend", "--plain")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("running units:\n%s", running)
		for _, unit := range []string{"docker", "containerd", "postgresql", "etcd", "nix-daemon"} {
			if strings.Contains(string(running), unit) {
				t.Errorf("%s runs in the machine", unit)
			}
			if state, _ := m.Show(ctx, unit+".service", "ActiveState"); state != "inactive" {
				t.Errorf("%s.service is %q, want inactive", unit, state)
			}
		}
		if out, err := m.Exec(ctx, "cat", "/etc/machine-id"); err != nil || len(strings.TrimSpace(string(out))) != 32 {
			t.Errorf("machine id: %q, %v", out, err)
		}
	})

	t.Run("notify", func(t *testing.T) {
		if _, err := m.Systemctl(ctx, "start", "--no-block", "notify.service"); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitState(ctx, "notify.service", "activating"); err != nil {
			t.Fatal(err)
		}
		if sub, _ := m.Show(ctx, "notify.service", "SubState"); sub != "start" {
			t.Errorf("SubState before READY=1: %q, want start", sub)
		}
		if err := os.WriteFile(filepath.Join(m.OptDir(), "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitState(ctx, "notify.service", "active"); err != nil {
			t.Fatal(err)
		}
		if status, err := m.Show(ctx, "notify.service", "StatusText"); status != "serving knotless" {
			t.Errorf("StatusText: %q, %v", status, err)
		}
		if _, err := m.Systemctl(ctx, "stop", "notify.service"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("credential", func(t *testing.T) {
		token := randomHex(8)
		if err := os.WriteFile(filepath.Join(m.OptDir(), "token"), []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Systemctl(ctx, "start", "cred.service"); err != nil {
			t.Fatal(err)
		}
		e := waitJournal(ctx, t, m, "cred.service", func(e JournalEntry) bool {
			return strings.HasPrefix(e["MESSAGE"], "credential ")
		})
		if want := "credential token=" + token + " in /run/credentials/cred.service"; e["MESSAGE"] != want {
			t.Errorf("unit printed %q, want %q", e["MESSAGE"], want)
		}
	})

	t.Run("journal", func(t *testing.T) {
		if _, err := m.Systemctl(ctx, "start", "log.service"); err != nil {
			t.Fatal(err)
		}
		e := waitJournal(ctx, t, m, "log.service", func(e JournalEntry) bool { return e["MESSAGE"] == "knotless warning" })
		if e["PRIORITY"] != "4" || e["SYSLOG_IDENTIFIER"] != "knotless-test" || e["_SYSTEMD_UNIT"] != "log.service" {
			t.Errorf("stdout entry: PRIORITY=%q SYSLOG_IDENTIFIER=%q _SYSTEMD_UNIT=%q",
				e["PRIORITY"], e["SYSLOG_IDENTIFIER"], e["_SYSTEMD_UNIT"])
		}
		// A process that logs and exits at once (logger, systemd-cat)
		// may be gone before journald looks up its unit: look for its
		// entry in the whole journal. (The unit's own stdout carries the
		// unit's name and is always attributed.)
		e = waitJournal(ctx, t, m, "", func(e JournalEntry) bool { return e["KNOTLESS_RUN"] != "" })
		if e["KNOTLESS_RUN"] != "run-42" || e["MESSAGE"] != "knotless structured" || e["PRIORITY"] != "3" {
			t.Errorf("logger --journald entry: %v", e)
		}
	})

	t.Run("env", func(t *testing.T) {
		if _, err := m.Systemctl(ctx, "start", "env.service"); err != nil {
			t.Fatal(err)
		}
		e := waitJournal(ctx, t, m, "env.service", func(e JournalEntry) bool { return strings.HasPrefix(e["MESSAGE"], "greeting=") })
		if want := "greeting=" + greeting; e["MESSAGE"] != want {
			t.Errorf("unit printed %q, want %q", e["MESSAGE"], want)
		}
	})

	t.Run("timer", func(t *testing.T) {
		if _, err := m.Systemctl(ctx, "start", "tick.timer"); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := os.Stat(filepath.Join(m.OptDir(), "ticked")); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				st, _ := m.Systemctl(context.Background(), "status", "tick.timer", "tick.service")
				t.Fatalf("the timer did not fire:\n%s", st)
			case <-time.After(200 * time.Millisecond):
			}
		}
		if err := m.WaitState(ctx, "tick.service", "inactive"); err != nil {
			t.Fatal(err)
		}
		if res, _ := m.Show(ctx, "tick.service", "Result"); res != "success" {
			t.Errorf("tick.service Result: %q", res)
		}
	})

	t.Run("host loopback", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		got := make(chan string, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				got <- err.Error()
				return
			}
			defer c.Close()
			line, _ := bufio.NewReader(io.LimitReader(c, 100)).ReadString('\n')
			got <- line
		}()
		// Added after boot: the units directory is live.
		port := l.Addr().(*net.TCPAddr).Port
		unit := fmt.Sprintf("[Service]\nType=oneshot\nExecStart=/bin/bash -c 'echo knotless-ping >/dev/tcp/127.0.0.1/%d'\n", port)
		if err := os.WriteFile(filepath.Join(m.UnitsDir(), "net.service"), []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Systemctl(ctx, "daemon-reload"); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Systemctl(ctx, "start", "net.service"); err != nil {
			t.Fatal(err)
		}
		select {
		case line := <-got:
			if line != "knotless-ping\n" {
				t.Errorf("the host listener read %q", line)
			}
		case <-ctx.Done():
			t.Fatal("nothing connected to the host's listener")
		}
	})
}

// nspawns lists the host's systemd-nspawn processes of the machine.
func nspawns(name string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), name) && strings.Contains(string(b), "systemd-nspawn") {
			out = append(out, p+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// checkGone checks that nothing of a machine is left on the host.
func checkGone(t *testing.T, m *Machine) {
	t.Helper()
	if left := m.Leftovers(); len(left) > 0 {
		t.Errorf("left after teardown:\n%s", strings.Join(left, "\n"))
	}
	if p := nspawns(m.Name()); len(p) > 0 {
		t.Errorf("nspawn processes left:\n%s", strings.Join(p, "\n"))
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), m.Dir()) || strings.Contains(string(mounts), m.Name()) {
		t.Errorf("mounts of the machine left:\n%s", mounts)
	}
	for _, root := range cgroupRoots() {
		_ = filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			if e.Name() == m.Name() {
				t.Errorf("cgroup left: %s", p)
			}
			if strings.Count(strings.TrimPrefix(p, root), "/") >= 2 {
				return filepath.SkipDir
			}
			return nil
		})
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	m := Boot(t, Options{})
	ctx := testContext(t)
	if len(m.pids()) < 2 || len(m.Leftovers()) == 0 {
		t.Fatalf("a running machine shows no processes: %v", m.Leftovers())
	}
	if err := m.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, err := m.Exec(ctx, "true"); err == nil {
		t.Errorf("exec in a closed machine worked")
	}
	checkGone(t, m)
}

// TestLeftoversOfKilledProcess boots a machine in a child test process,
// kills everything at once as the end of a session does, and checks that
// the next Boot's cleanup removes what was left.
func TestLeftoversOfKilledProcess(t *testing.T) {
	skip(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildMachine$", "-test.v")
	cmd.Env = append(os.Environ(), "KNOTLESS_NSPAWN_CHILD=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var m *Machine
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "READY" {
			leader, _ := strconv.Atoi(f[2])
			m = &Machine{id: filepath.Base(f[1]), dir: f[1], leader: leader}
			break
		}
	}
	if m == nil {
		_ = cmd.Wait()
		t.Fatalf("the child never booted its machine")
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	// Hold the lock on Base, so that no other test's Boot cleans the
	// child's leftovers before this test looks at them.
	global, err := lockBase()
	if err != nil {
		t.Fatal(err)
	}
	defer global.Close()
	_ = cmd.Process.Kill()
	for _, pid := range m.pids() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = cmd.Wait()
	time.Sleep(500 * time.Millisecond)
	left := m.Leftovers()
	if len(left) == 0 {
		t.Fatalf("the killed child left nothing: the test tests nothing")
	}
	t.Logf("left by the killed child:\n%s", strings.Join(left, "\n"))
	if err := cleanDead(); err != nil {
		t.Fatalf("clean: %v", err)
	}
	global.Close()
	checkGone(t, m)
}

// TestChildMachine is the child of TestLeftoversOfKilledProcess: it boots
// a machine and waits to be killed.
func TestChildMachine(t *testing.T) {
	if os.Getenv("KNOTLESS_NSPAWN_CHILD") != "1" {
		t.Skip("run only as the child of TestLeftoversOfKilledProcess")
	}
	m := Boot(t, Options{})
	fmt.Printf("READY %s %d\n", m.Dir(), m.Leader())
	time.Sleep(10 * time.Minute)
}
