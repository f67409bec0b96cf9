package daemon_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/checks"
)

// writeMeter is a loopback reverse proxy in front of the real PDS that
// the runner writes through: it counts the record writes (a create
// costs a hosted PDS 3 points, an update 2) and the blob uploads, and
// can add the ratelimit-* headers a hosted PDS states to its answers to
// record writes.
type writeMeter struct {
	srv *httptest.Server

	mu     sync.Mutex
	writes []meteredWrite
	blobs  int
	// remaining, when set, is the ratelimit-remaining the answers to
	// record writes state (of a limit of 5,000, resetting in an hour).
	remaining int
}

type meteredWrite struct {
	collection, rkey string
	create           bool
	status           string // a check's
}

func newWriteMeter(t *testing.T, target string) *writeMeter {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	m := &writeMeter{}
	seen := map[string]bool{}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		ModifyResponse: func(resp *http.Response) error {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.remaining > 0 && resp.Request.URL.Path == "/xrpc/com.atproto.repo.putRecord" {
				resp.Header.Set("RateLimit-Limit", "5000")
				resp.Header.Set("RateLimit-Remaining", strconv.Itoa(m.remaining))
				resp.Header.Set("RateLimit-Reset", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10))
			}
			return nil
		},
	}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			switch r.URL.Path {
			case "/xrpc/com.atproto.repo.uploadBlob":
				m.mu.Lock()
				m.blobs++
				m.mu.Unlock()
			case "/xrpc/com.atproto.repo.putRecord", "/xrpc/com.atproto.repo.createRecord",
				"/xrpc/com.atproto.repo.applyWrites", "/xrpc/com.atproto.repo.deleteRecord":
				var in struct {
					Collection, Rkey string
					Record           struct{ Status string }
				}
				_ = json.Unmarshal(body, &in)
				m.mu.Lock()
				key := in.Collection + "/" + in.Rkey
				m.writes = append(m.writes, meteredWrite{in.Collection, in.Rkey, !seen[key], in.Record.Status})
				seen[key] = true
				m.mu.Unlock()
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(m.srv.Close)
	return m
}

// of are the writes of the record rkey of collection, and their points.
func (m *writeMeter) of(collection, rkey string) (statuses []string, points int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.writes {
		if w.collection == collection && w.rkey == rkey {
			statuses = append(statuses, w.status)
			points += map[bool]int{true: 3, false: 2}[w.create]
		}
	}
	return statuses, points
}

func (m *writeMeter) counts() (writes, blobs int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.writes), m.blobs
}

const oneStep = `
on: [push]
branches: [main]
steps:
  - name: hi
    run: echo hi
`

// TestWritesPerRun: through serve, on the real PDS, a one-step run that
// a free worker takes costs 5 write points (its check created running,
// updated to its final status: no queued record) and one blob (its
// log); the runner writes nothing else.
func TestWritesPerRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	meter := newWriteMeter(t, w.Server.URL)
	_, commit := w.Push(map[string]string{".knotless/workflows/ci.yaml": workflowFile(oneStep)})
	stop := w.start(w.config(func(c *daemon.Config) { c.Account.PDS = meter.srv.URL }))
	rkey, got := w.waitFinal("ci", commit, 90*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got.Status != "success" {
		t.Fatalf("status %s (%s), want success", got.Status, got.Error)
	}
	statuses, points := meter.of(forge.CollectionCheck, rkey)
	if diff := cmp.Diff([]string{"running", "success"}, statuses); diff != "" {
		t.Errorf("check writes (-want +got):\n%s", diff)
	}
	if points > 5 {
		t.Errorf("%d write points for one run, want at most 5", points)
	}
	if writes, blobs := meter.counts(); writes != len(statuses) || blobs != 1 {
		t.Errorf("%d record writes and %d blobs in all, want only the check's %d and the log", writes, blobs, len(statuses))
	}
	if got.Log == nil {
		t.Error("no log blob (--log-blobs always)")
	}
}

// TestLowBudgetDefersRunningWrites: through serve, on the real PDS,
// once the PDS's answers say little is left of its write budget, a run's
// running record waits and its final one does not; with --log-blobs
// failures a successful run uploads no log.
func TestLowBudgetDefersRunningWrites(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	meter := newWriteMeter(t, w.Server.URL)
	meter.remaining = 100 // of 5,000: low
	_, first := w.Push(map[string]string{".knotless/workflows/ci.yaml": workflowFile(oneStep)})
	stop := w.start(w.config(func(c *daemon.Config) {
		c.Account.PDS = meter.srv.URL
		c.LogBlobs = checks.LogBlobsFailures
	}))
	// The first run's running write is what tells the runner the budget
	// is low.
	rkey1, got1 := w.waitFinal("ci", first, 90*time.Second)
	_, second := w.Push(map[string]string{"again.txt": "again\n"})
	rkey2, got2 := w.waitFinal("ci", second, 90*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got1.Status != "success" || got2.Status != "success" {
		t.Fatalf("statuses %s, %s; want success", got1.Status, got2.Status)
	}
	s1, _ := meter.of(forge.CollectionCheck, rkey1)
	if diff := cmp.Diff([]string{"running", "success"}, s1); diff != "" {
		t.Errorf("first run's writes, before the budget was known (-want +got):\n%s", diff)
	}
	s2, points := meter.of(forge.CollectionCheck, rkey2)
	if diff := cmp.Diff([]string{"success"}, s2); diff != "" {
		t.Errorf("second run's writes, the budget low (-want +got):\n%s", diff)
	}
	if points != 3 {
		t.Errorf("second run: %d points, want 3 (one create)", points)
	}
	if _, blobs := meter.counts(); blobs != 0 {
		t.Errorf("%d blobs uploaded for successful runs, want none (--log-blobs failures)", blobs)
	}
	if got1.Log != nil || got2.Log != nil {
		t.Error("a successful run's check carries its log (--log-blobs failures)")
	}
}
