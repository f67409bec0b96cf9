package daemon_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/tests/livefollow"
)

var listening = regexp.MustCompile(`msg="serving live output" .*listen=(\S+)`)

// listener is the address the daemon's live output listener took (it
// listens on port 0), from its log.
func (w *world) listener(t *testing.T) string {
	t.Helper()
	var addr string
	waitUntil(t, "the live output listener", time.Minute, func() bool {
		m := listening.FindStringSubmatch(w.logText())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return "http://" + addr
}

const liveSecret = "s3cret-live-value"

// The acceptance on the real PDS: a subscriber through the
// runner's listener and one through a real output service (the puts
// authenticated with the runner PDS's service-auth tokens) both see a
// line of a running step before the step ends (it waits for a file the
// test makes only once both have seen it), and at the end exactly the
// bytes of the final log blob, the secret masked, a secret printed in
// two writes included. The running check says where the output is
// read; the final one keeps that and lists the run's file, which both
// serve.
func TestLiveOutput(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	service := livefollow.Service(t, w.Runner.DID.String(), w.Server.Directory())
	gate := filepath.Join(t.TempDir(), "go")
	_, commit := w.Push(map[string]string{".knotless/workflows/live.yaml": workflowFile(`
on: [push]
secrets: [LIVE_TOKEN]
artifacts: [report.txt]
steps:
  - name: build
    secrets: [LIVE_TOKEN]
    run: |
      echo "the line before the gate"
      printf 'token=%s' "${LIVE_TOKEN%%-*}"
      sleep 0.2
      printf '%s\n' "-${LIVE_TOKEN#*-}"
      while [ ! -e ` + gate + ` ]; do sleep 0.1; done
      echo "the line after the gate"
      printf 'a report %s\n' "$LIVE_TOKEN" > "$KNOTLESS_RUN_OUTPUTS/report.txt"
      printf 'TOKEN=%s\n' "$LIVE_TOKEN" > "$KNOTLESS_RUN_OUTPUTS/deploy.env"
  - name: test
    run: echo "the second step"
`)})
	w.start(w.config(func(c *daemon.Config) {
		c.Scheduler.Secrets = []scheduler.OperatorSecret{{Name: "LIVE_TOKEN", Value: liveSecret, Repos: []string{w.RepoURI.String()}}}
		c.Live = live.Config{Listen: "127.0.0.1:0", Service: service, ServiceDID: livefollow.ServiceDID}
	}))
	direct := w.listener(t)

	var key string
	var running forge.Check
	waitUntil(t, "the running check", 2*time.Minute, func() bool {
		for _, cw := range w.checkLog.all() {
			if cw.Workflow == "live" && cw.Status == forge.StatusRunning {
				running = cw
				key = forge.CheckKey(cw.Subject, "live")
				return true
			}
		}
		return false
	})
	wantLive := &forge.LiveOutput{Service: service, Page: service + "/runs/" + w.Runner.DID.String() + "/" + key}
	if diff := cmp.Diff(wantLive, running.Live); diff != "" {
		t.Errorf("the running check's live (-want +got):\n%s", diff)
	}
	check := "at://" + w.Runner.DID.String() + "/" + forge.CollectionCheck + "/" + key
	viaRunner := livefollow.Follow(t.Context(), &outputhttp.Client{Base: direct}, check)
	defer viaRunner.Close()
	viaService := livefollow.Follow(t.Context(), &outputhttp.Client{Base: service}, check)
	defer viaService.Close()
	viaRunner.WaitFor(t, "the line before the gate", 2*time.Minute)
	viaService.WaitFor(t, "the line before the gate", 2*time.Minute)
	for _, c := range w.Checks() {
		if c.URI.RecordKey().String() == key && c.Value.Final() {
			t.Fatalf("the check is final (%s) before the step was let go on", c.Value.Status)
		}
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	_, final := w.waitFinal("live", commit, 2*time.Minute)
	if final.Status != "success" {
		t.Fatalf("final check %s (%s)", final.Status, final.Error)
	}
	blob := string(w.Blob(final.Log.Ref.String()))
	if strings.Contains(blob, liveSecret) || strings.Contains(blob, "s3cret") || !strings.Contains(blob, "token=***") {
		t.Errorf("the secret is not masked in the log blob:\n%s", blob)
	}
	for name, f := range map[string]*livefollow.Follower{"the runner's listener": viaRunner, "the output service": viaService} {
		end := f.Wait(t, 2*time.Minute)
		if got := f.Bytes(); got != blob {
			t.Errorf("through %s: %q\nthe log blob: %q", name, got, blob)
		}
		if end.Status != "success" || end.Size != int64(len(blob)) || len(f.Faults()) != 0 || len(f.Runs()) != 1 {
			t.Errorf("through %s: end %+v, faults %v, runs %v", name, end, f.Faults(), f.Runs())
		}
	}
	if diff := cmp.Diff(wantLive, final.Live); diff != "" {
		t.Errorf("the final check's live (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]forge.RunFile{{Path: "report.txt", Size: 13}}, final.Files); diff != "" {
		t.Errorf("the final check's files (-want +got):\n%s", diff)
	}
	for _, base := range []string{direct, service} {
		var body string
		// The service has the file once the pusher sent it, after the
		// output's end.
		waitUntil(t, "the run's file at "+base, time.Minute, func() bool {
			body = get(t, base+"/xrpc/dev.knotless.getRunFile?check="+check+"&path=report.txt")
			return body != ""
		})
		if body != "a report ***\n" {
			t.Errorf("%s: the run's file is %q", base, body)
		}
		if body := get(t, base+"/xrpc/dev.knotless.getRunFile?check="+check+"&path=deploy.env"); body != "" {
			t.Errorf("%s: deploy.env, which artifacts do not name, is served: %q", base, body)
		}
	}
	if page := get(t, direct+"/runs/"+w.Runner.DID.String()+"/"+key); !strings.Contains(page, "<html") {
		t.Errorf("the runner's page: %q", page)
	}
}

// get returns the body of a GET that succeeded, or "".
func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}
