package daemon_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/parts/state"
)

// outage is a loopback reverse proxy in front of the real PDS that can
// be told to answer instead of it: a PDS outage (502), a rate limit
// (429 with its headers) or a refusal (400), as the PDS would.
type outage struct {
	srv   *httptest.Server
	mu    sync.Mutex
	fault func(r *http.Request, body []byte) (status int, h http.Header, name string)
	hits  int
}

func newOutage(t *testing.T, target string) *outage {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	o := &outage{}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		o.mu.Lock()
		f := o.fault
		o.mu.Unlock()
		if f != nil {
			if status, h, name := f(r, body); status != 0 {
				o.mu.Lock()
				o.hits++
				o.mu.Unlock()
				for k, v := range h {
					w.Header()[k] = v
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `{"error":"`+name+`","message":"injected by the test"}`)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(o.srv.Close)
	return o
}

func (o *outage) set(f func(r *http.Request, body []byte) (int, http.Header, string)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fault = f
	o.hits = 0
}

func (o *outage) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.hits
}

// down answers every request with status.
func down(status int, h http.Header, name string) func(*http.Request, []byte) (int, http.Header, string) {
	return func(*http.Request, []byte) (int, http.Header, string) { return status, h, name }
}

// gatedWorkflow waits for a file before it ends, and counts its runs
// in another.
func gatedWorkflow(dir string) string {
	return workflowFile(`
on: [push]
steps:
  - name: work
    run: |
      echo ran >> ` + filepath.Join(dir, "runs") + `
      while [ ! -e ` + filepath.Join(dir, "go") + ` ]; do sleep 0.1; done
      echo done
`)
}

func runsIn(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "runs"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "ran\n")
}

func waitUntil(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOwedCheck: a final check the PDS does not take (502, then a rate
// limit) is owed, written when the PDS answers again — by the same
// process, or at restart by the next — and the work never runs twice.
func TestOwedCheck(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	proxy := newOutage(t, srv.URL)
	gate := t.TempDir()
	_, commit := w.Push(map[string]string{".knotless/workflows/gated.yaml": gatedWorkflow(gate)})
	fast := func(c *daemon.Config) {
		c.Account.PDS = proxy.srv.URL
		c.Retry = daemon.Retry{Backoff: 200 * time.Millisecond, MaxBackoff: time.Second}
	}
	observed, value := withMetrics(t)
	stop := w.start(w.config(fast, observed))
	waitUntil(t, "the running check", 90*time.Second, func() bool { return slices.Contains(w.checkLog.statuses("gated", commit), "running") })

	// The PDS goes away across the run's end.
	proxy.set(down(http.StatusBadGateway, nil, "BadGateway"))
	if err := os.WriteFile(filepath.Join(gate, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the final check to be owed", 60*time.Second, func() bool { return strings.Contains(w.logText(), "it is owed") })
	waitUntil(t, "retries of the owed check", 30*time.Second, func() bool { return proxy.count() >= 3 })
	time.Sleep(2 * time.Second) // several reconciles (poll 300 ms)
	if n := runsIn(t, gate); n != 1 {
		t.Fatalf("the work ran %d times during the outage, want 1", n)
	}
	proxy.set(nil)
	_, got := w.waitFinal("gated", commit, 30*time.Second)
	if got.Status != "success" {
		t.Fatalf("final check %s (%s), want success", got.Status, got.Error)
	}

	// Second push: rate-limited across its end, and the daemon stops
	// before the PDS takes the check; the next process writes it.
	if err := os.Remove(filepath.Join(gate, "go")); err != nil {
		t.Fatal(err)
	}
	_, commit2 := w.Push(map[string]string{".knotless/workflows/gated.yaml": gatedWorkflow(gate), "b": "2"})
	waitUntil(t, "the second running check", 90*time.Second, func() bool { return slices.Contains(w.checkLog.statuses("gated", commit2), "running") })
	reset := time.Now().Add(3 * time.Second).Unix()
	proxy.set(down(http.StatusTooManyRequests, http.Header{"Ratelimit-Remaining": {"0"}, "Ratelimit-Reset": {itoa(reset)}}, "RateLimitExceeded"))
	if err := os.WriteFile(filepath.Join(gate, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the second final check to be owed", 60*time.Second, func() bool {
		st, err := state.Load(w.stateDir)
		return err == nil && len(st.Owed) == 1
	})
	// The rate limit's reset is respected: no retry before it.
	time.Sleep(time.Second)
	if n := proxy.count(); n > 2 {
		t.Errorf("%d requests within the rate limit's window, want the owed check to wait for ratelimit-reset", n)
	}
	// The metrics: the owed check, and its write put off until the reset.
	if owed, waits := value("knotless_run_owed_checks"), value("knotless_run_pds_ratelimit_waits_total"); owed != 1 || waits < 1 {
		t.Errorf("owed_checks %g, pds_ratelimit_waits_total %g; want 1 and at least 1", owed, waits)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	proxy.set(nil)
	w.start(w.config(fast))
	_, got = w.waitFinal("gated", commit2, 60*time.Second)
	if got.Status != "success" {
		t.Fatalf("second final check %s (%s), want success", got.Status, got.Error)
	}
	time.Sleep(2 * time.Second)
	if n := runsIn(t, gate); n != 2 {
		t.Fatalf("the work ran %d times for two pushes, want 2", n)
	}
	waitUntil(t, "the owed list to empty", 10*time.Second, func() bool {
		st, err := state.Load(w.stateDir)
		return err == nil && len(st.Owed) == 0
	})
}

// TestRefusedCheck: a final check the PDS refuses as invalid (400) is
// replaced by a minimal error check saying so; the work is not run again.
func TestRefusedCheck(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	proxy := newOutage(t, srv.URL)
	gate := t.TempDir()
	if err := os.WriteFile(filepath.Join(gate, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	proxy.set(func(r *http.Request, body []byte) (int, http.Header, string) {
		if strings.HasSuffix(r.URL.Path, "com.atproto.repo.putRecord") && bytes.Contains(body, []byte(`"status":"success"`)) {
			return http.StatusBadRequest, nil, "InvalidRecord"
		}
		return 0, nil, ""
	})
	_, commit := w.Push(map[string]string{".knotless/workflows/gated.yaml": gatedWorkflow(gate)})
	observed, value := withMetrics(t)
	w.start(w.config(func(c *daemon.Config) { c.Account.PDS = proxy.srv.URL }, observed))
	_, got := w.waitFinal("gated", commit, 90*time.Second)
	if got.Status != "error" || !strings.HasPrefix(got.Error, "check record refused: ") {
		t.Fatalf("final check %s (%q), want error \"check record refused: …\"", got.Status, got.Error)
	}
	if n := value("knotless_run_check_refusals_total"); n != 1 {
		t.Errorf("check_refusals_total %g, want 1", n)
	}
	time.Sleep(2 * time.Second)
	if n := runsIn(t, gate); n != 1 {
		t.Fatalf("the work ran %d times, want 1", n)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
