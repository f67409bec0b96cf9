package appliance_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/livefollow"
)

// tickingWorkflow prints a line every 0.2 s (with the secret, masked)
// until /work/go is made in its pod, so its output goes on through a
// handover or a kill of the daemon.
const tickingWorkflow = `
on: [push]
secrets: [DEPLOY_TOKEN]
steps:
  - name: ticks
    secrets: [DEPLOY_TOKEN]
    run: |
      echo "phase one"
      i=0
      while [ ! -e /work/go ]; do i=$((i+1)); echo "tick $i token=$DEPLOY_TOKEN"; sleep 0.2; done
      echo "phase two"
  - name: after
    run: echo "the step after"
`

// goldenServiceDID is the output service's DID in its rendered unit.
const goldenServiceDID = "did:web:output.example.com"

// startOutputService installs the module's output service unit
// (tests/nix/golden/knotless-output.service) in the machine, taking the
// world's runner's output, resolving DIDs through the test PLC and
// listening on listen, and starts it.
func (a *appliance) startOutputService(t *testing.T, w *world, listen string) {
	t.Helper()
	u := unit(t, "knotless-output.service")
	for old, repl := range map[string]string{
		"--listen 127.0.0.1:8789":           "--listen " + listen,
		"--plc-url https://plc.example.com": "--plc-url " + srv.PLCURL,
		"--runner did:plc:7u2ld3ffgzqvezmv6wxgxiix --runner did:plc:ewvi7nxzyoun6zhxrhs64oiz": "--runner " + w.Runner.DID.String(),
		"--service-did " + goldenServiceDID:                                                   "--service-did " + goldenServiceDID,
	} {
		if !strings.Contains(u, old) {
			t.Fatalf("the output service's unit has no %q:\n%s", old, u)
		}
		u = strings.ReplaceAll(u, old, repl)
	}
	a.writeFile("/etc/systemd/system/knotless-output.service", []byte(u), 0o644)
	// What NixOS makes of users.users.knotless-output.
	a.sh(`echo 'u knotless-output - "knotless-run output service" /var/lib/knotless-output' > /etc/sysusers.d/knotless-output.conf && systemd-sysusers && systemctl daemon-reload`)
	if out, err := a.systemctl("start", "knotless-output.service"); err != nil {
		t.Fatalf("systemctl start knotless-output.service: %v\n%s", err, out)
	}
}

// freePort is a loopback port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// TestLiveOutputAcrossStopAndKill: the module's Kubernetes runner under
// a real systemd, with its listener (--listen) and pushing to a real
// output service, the module's own unit in the same machine
// (--output-service, with tokens from the real PDS). A reader through each follows a run whose step prints all
// along:
//
//   - across a SIGTERM (systemctl restart: the run handed over and
//     adopted) the reader of the service, on one connection, and the
//     reader of the runner, coming back to the new process with the run
//     and offset it reached, see every byte once, no gap, and at the end
//     exactly the final log blob;
//   - across a SIGKILL (nothing handed over: the new process takes the
//     run up from its checkpoint and reads the step again from its
//     first byte) both readers see every byte once, of the one run, and
//     at the end exactly the final log blob.
//
// The secret the step prints is masked in all of it.
func TestLiveOutputAcrossStopAndKill(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	listen, svcListen := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	outSvc := "http://" + svcListen
	k := bootKube(t, c, w, map[string]any{"listen": listen, "output-service": outSvc, "output-service-did": goldenServiceDID})
	k.startOutputService(t, w, svcListen)
	direct := "http://" + listen

	follow := func(t *testing.T, commit string) (string, *livefollow.Follower, *livefollow.Follower) {
		t.Helper()
		w.waitCheck("ticks", commit, 3*time.Minute, running)
		got := w.checks("ticks", commit)[0]
		if got.Value.Live == nil || got.Value.Live.Service != outSvc {
			t.Fatalf("the running check's live: %+v, want the output service", got.Value.Live)
		}
		check := got.URI.String()
		viaRunner := livefollow.Follow(t.Context(), &outputhttp.Client{Base: direct}, check)
		t.Cleanup(viaRunner.Close)
		viaService := livefollow.Follow(t.Context(), &outputhttp.Client{Base: outSvc}, check)
		t.Cleanup(viaService.Close)
		viaRunner.WaitFor(t, "tick 2 ", 3*time.Minute)
		viaService.WaitFor(t, "tick 2 ", 3*time.Minute)
		return check, viaRunner, viaService
	}
	release := func(t *testing.T, runID string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.WaitForCommand(ctx, k.ns, kubernetes.LabelRun+"="+runID, "run", []string{"touch", "/work/go"}); err != nil {
			t.Fatalf("release the step of run %s: %v", runID, err)
		}
	}
	ended := func(t *testing.T, commit string, followers map[string]*livefollow.Follower) (forge.Check, string) {
		t.Helper()
		final := w.waitCheck("ticks", commit, 5*time.Minute, final)
		if final.Status != "success" {
			t.Fatalf("the run: %s (%s)", final.Status, final.Error)
		}
		blob := w.blob(t, final)
		if strings.Contains(blob, secretValue) || !strings.Contains(blob, "token=***") {
			t.Errorf("the secret is not masked in the log blob:\n%s", blob)
		}
		for name, f := range followers {
			end := f.Wait(t, 3*time.Minute)
			if got := f.Bytes(); got != blob {
				t.Errorf("through %s: %d bytes, the log blob %d:\n%s\n--- the blob:\n%s", name, len(got), len(blob), got, blob)
			}
			if end.Status != "success" || len(f.Faults()) != 0 {
				t.Errorf("through %s: end %+v, faults %v", name, end, f.Faults())
			}
			for _, run := range f.Runs() {
				if strings.Contains(f.RunBytes(run), secretValue) {
					t.Errorf("through %s: the secret shows in run %s's output", name, run)
				}
			}
		}
		return final, blob
	}

	t.Run("a handover at SIGTERM", func(t *testing.T) {
		commit := w.push(map[string]string{".knotless/workflows/ticks.yaml": tickingWorkflow})
		_, viaRunner, viaService := follow(t, commit)
		oldPID := k.show(service, "MainPID")
		if out, err := k.systemctl("restart", service); err != nil {
			t.Fatalf("systemctl restart: %v\n%s", err, out)
		}
		journal := k.journal(service)
		if e := find(journal, "handed over 1 runs"); len(e) != 1 || e[0]["_PID"] != oldPID || e[0]["GOING_ON"] != "1" {
			t.Fatalf("want the old process (%s) to hand its run over; got %v", oldPID, e)
		}
		runs := viaService.Runs()
		// The new process's output: ticks it read from the step's spool.
		before := len(viaService.Bytes())
		waitGrown(t, viaService, before)
		waitGrown(t, viaRunner, len(viaRunner.Bytes()))
		release(t, runs[0])
		_, blob := ended(t, commit, map[string]*livefollow.Follower{"the runner": viaRunner, "the service": viaService})
		if n := len(find(k.journal(service), "adopted 1 runs")); n != 1 {
			t.Errorf("the new process adopted %d times, want once", n)
		}
		for name, f := range map[string]*livefollow.Follower{"the runner": viaRunner, "the service": viaService} {
			if r := f.Runs(); len(r) != 1 || r[0] != runs[0] {
				t.Errorf("through %s: runs %v, want the one run handed over", name, r)
			}
		}
		if viaService.Conns() != 1 {
			t.Errorf("the service's reader connected %d times, want once across the handover", viaService.Conns())
		}
		if viaRunner.Conns() < 2 {
			t.Errorf("the runner's reader connected %d times: it did not come back to the new process", viaRunner.Conns())
		}
		ticks(t, blob)
	})

	t.Run("a run taken up after SIGKILL", func(t *testing.T) {
		commit := w.push(map[string]string{".knotless/workflows/ticks.yaml": tickingWorkflow + "\n# again\n"})
		_, viaRunner, viaService := follow(t, commit)
		runs := viaService.Runs()
		oldPID := k.show(service, "MainPID")
		if out, err := k.systemctl("kill", "--signal=KILL", service); err != nil {
			t.Fatalf("systemctl kill: %v\n%s", err, out)
		}
		k.restarted(oldPID, 2*time.Minute)
		// The new process reads the step again from its first byte; the
		// readers, at the offsets they reached, get what comes after.
		waitGrown(t, viaService, len(viaService.Bytes()))
		waitGrown(t, viaRunner, len(viaRunner.Bytes()))
		release(t, runs[0])
		_, blob := ended(t, commit, map[string]*livefollow.Follower{"the runner": viaRunner, "the service": viaService})
		if n := len(find(k.journal(service), "a run of a process that died is taken up where it stands")); n != 1 {
			t.Errorf("the new process took the run up %d times, want once", n)
		}
		for name, f := range map[string]*livefollow.Follower{"the runner": viaRunner, "the service": viaService} {
			if r := f.Runs(); len(r) != 1 || r[0] != runs[0] {
				t.Errorf("through %s: runs %v, want the one run, taken up", name, r)
			}
		}
		if n := len(w.checks("ticks", commit)); n != 1 {
			t.Errorf("%d checks, want one", n)
		}
		ticks(t, blob)
	})
}

// waitGrown waits until f has more than n bytes of its run.
func waitGrown(t *testing.T, f *livefollow.Follower, n int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for len(f.Bytes()) <= n {
		if time.Now().After(deadline) {
			t.Fatalf("no output past %d bytes after the restart", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ticks checks that the log has each tick once, in order from 1: the
// log (and so the output) repeats and loses none.
func ticks(t *testing.T, blob string) {
	t.Helper()
	want := 1
	for _, line := range strings.Split(blob, "\n") {
		if !strings.HasPrefix(line, "tick ") {
			continue
		}
		if line != fmt.Sprintf("tick %d token=***", want) {
			t.Errorf("line %q, want tick %d", line, want)
			return
		}
		want++
	}
	if want < 3 {
		t.Errorf("%d ticks in the log", want-1)
	}
}
