package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// TestServeOneProcessPerStateDir: real serve processes (the shell
// executor) on one runner. While the first lives, a second on its state
// directory exits ExitConfig naming it (its pid, since when), and so
// does one of the same runner on another state directory (this host's
// runner lock); so does one started while the first hands over after
// SIGTERM (the lock is held until the handover's state is saved and
// the process ends). After the first is killed with SIGKILL (its
// step's process, in a session of its own, still alive), the next
// starts at once and the lock names it.
func TestServeOneProcessPerStateDir(t *testing.T) {
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
	dir := t.TempDir()
	marker, stepPID := filepath.Join(dir, "step-started"), filepath.Join(dir, "step-pid")
	w.Push(map[string]string{
		".knotless/workflows/long.yaml": "on: [push]\nsteps:\n  - name: long\n    run: echo $$ > " + stepPID + "; touch " + marker + "; exec sleep 300\n",
	})
	t.Cleanup(func() {
		if b, err := os.ReadFile(stepPID); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	pwFile := filepath.Join(dir, "app-password")
	writeFile(t, pwFile, w.Password+"\n")
	stateDir := filepath.Join(dir, "state")
	config := func(name, stateDir string) string {
		file := filepath.Join(dir, name+".json")
		writeFile(t, file, fmt.Sprintf(`{"executor": "shell", "did": %q, "pds": %q, "plc-url": %q, "state-dir": %q, "cache-dir": %q,
  "shell-root": %q, "stop-wait": "10m", "poll": "300ms", "app-password-file": %q, "allow-local-sources": true}`,
			w.Runner.DID, srv.URL, srv.PLCURL, stateDir, filepath.Join(dir, name+"-cache"), filepath.Join(dir, name+"-shell"), pwFile))
		return file
	}
	same, other := config("same", stateDir), config("other", filepath.Join(dir, "other-state"))
	command := func(ctx context.Context, cfgFile string) (*exec.Cmd, *syncbuf.Buffer, *notifications) {
		sockName := filepath.Join(t.TempDir(), "notify.sock")
		sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockName, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sock.Close() })
		notes := &notifications{}
		go notes.read(sock)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestServeHelperProcess$", "--", "--config", cfgFile, w.Owner.DID.String()+"/hello")
		cmd.Env = append(os.Environ(), "KNOTLESS_SERVE_HELPER=1", "NOTIFY_SOCKET="+sockName)
		logs := &syncbuf.Buffer{}
		cmd.Stderr, cmd.Stdout = logs, logs
		return cmd, logs, notes
	}
	start := func(cfgFile string) (*exec.Cmd, *syncbuf.Buffer, *notifications) {
		cmd, logs, notes := command(ctx, cfgFile)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, logs, notes
	}
	// refused runs a serve that must exit ExitConfig saying each of want.
	refused := func(what, cfgFile string, want ...string) {
		t.Helper()
		// A process that is not refused is killed after a minute.
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		cmd, logs, _ := command(ctx, cfgFile)
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != ExitConfig {
			t.Fatalf("%s: %v, want exit status %d\n%s", what, err, ExitConfig, logs.String())
		}
		for _, s := range want {
			if !strings.Contains(logs.String(), s) {
				t.Errorf("%s: the error does not say %q:\n%s", what, s, logs.String())
			}
		}
	}

	first, logs1, notes1 := start(same)
	waitFor(t, 90*time.Second, func() bool { _, err := os.Stat(marker); return err == nil && notes1.has("READY=1") },
		func() string { return logs1.String() })
	firstPID := fmt.Sprintf("pid %d ", first.Process.Pid)
	refused("a second process on the state directory", same, "state directory "+stateDir+" is in use", firstPID, " since ", "--state-dir")
	refused("a second process of the runner on another state directory", other, "runner "+w.Runner.DID.String(), firstPID,
		"--state-dir "+stateDir, "--executor shell")

	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, func() bool { return notes1.has("STOPPING=1") }, func() string { return logs1.String() })
	refused("a process started while the first hands over", same, "state directory "+stateDir+" is in use", firstPID)

	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	b, err := os.ReadFile(stepPID)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the first process's step (pid %d) is gone, so the test does not show the lock is not inherited: %v", pid, err)
	}

	next, logs2, notes2 := start(same)
	waitFor(t, 90*time.Second, func() bool { return notes2.has("READY=1") }, func() string { return logs2.String() })
	lock, err := os.ReadFile(filepath.Join(stateDir, state.LockFile))
	if err != nil {
		t.Fatal(err)
	}
	var h state.Holder
	if err := json.Unmarshal(lock, &h); err != nil {
		t.Fatalf("lock file %q: %v", lock, err)
	}
	if h.PID != next.Process.Pid {
		t.Errorf("the lock names pid %d, want the successor's %d", h.PID, next.Process.Pid)
	}
	_ = next.Process.Signal(syscall.SIGTERM)
	if err := next.Wait(); err != nil {
		t.Errorf("successor: %v\n%s", err, logs2.String())
	}
}
