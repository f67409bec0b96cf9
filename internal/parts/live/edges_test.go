package live_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/rules/job"
)

// TestOffDoesNothing: without a listener or an output service, live
// output is off: Start makes no directory, there is no address, stop is
// a no-op, a run gets no stream and its check says no place to read it
// nor files.
func TestOffDoesNothing(t *testing.T) {
	t.Parallel()
	dir := live.FilesDir(t.TempDir())
	l := live.New(live.Config{}, runner, dir, live.Ports{}, nil)
	if err := l.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the files' directory: %v, want none made", err)
	}
	if a := l.Addr(); a != nil {
		t.Errorf("address %v, want none", a)
	}
	stop := l.Serve()
	j := &job.Job{Key: key}
	if w := l.Open(j, "r1", nil, nil); w != nil {
		t.Errorf("a stream %T, want none", w)
	}
	l.Ended(j, "r1", &run.Result{Status: run.Success}, t.TempDir())
	if got := l.Where(key); got != nil {
		t.Errorf("where %+v, want nowhere", got)
	}
	if got := l.Files(key); got != nil {
		t.Errorf("files %v, want none", got)
	}
	stop()
}

// TestFilesDir: the runs' files are kept in a directory of the cache
// of their own, which Start empties: not the cache itself.
func TestFilesDir(t *testing.T) {
	t.Parallel()
	if got, want := live.FilesDir("/var/cache/knotless-run"), "/var/cache/knotless-run/run-files"; got != want {
		t.Errorf("FilesDir: %q, want %q", got, want)
	}
}

// TestStartFailsOnATakenPort: a listener address another process holds
// fails the start, naming --listen, rather than a runner that says it
// serves output it cannot.
func TestStartFailsOnATakenPort(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	l := live.New(live.Config{Listen: taken.Addr().String()}, runner, filepath.Join(t.TempDir(), "files"), live.Ports{}, nil)
	err = l.Start()
	if err == nil || !strings.Contains(err.Error(), "--listen "+taken.Addr().String()) {
		t.Errorf("start: %v, want an error naming --listen and the address", err)
	}
}

// TestWhereNamesThePublicURL: a running check's live output is read at
// --public-url when set (its trailing slash dropped), else at the
// output service, else at the listener.
func TestWhereNamesThePublicURL(t *testing.T) {
	t.Parallel()
	page := "/runs/" + string(runner) + "/" + key
	for _, tc := range []struct {
		name  string
		cfg   live.Config
		start bool
		want  string // "" : the listener's address
	}{
		{"public URL", live.Config{Listen: "127.0.0.1:0", PublicURL: "https://runs.example/"}, true, "https://runs.example"},
		{"the listener", live.Config{Listen: "127.0.0.1:0"}, true, ""},
		{"the address asked for, before listening", live.Config{Listen: "127.0.0.1:8390"}, false, "http://127.0.0.1:8390"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := live.New(tc.cfg, runner, filepath.Join(t.TempDir(), "files"), live.Ports{}, nil)
			if tc.start {
				if err := l.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(l.Serve())
			}
			want := tc.want
			if want == "" {
				want = "http://" + l.Addr().String()
			}
			if l.Open(&job.Job{Key: key}, "r1", nil, nil) == nil {
				t.Fatal("no live output")
			}
			if diff := cmp.Diff(&forge.LiveOutput{Service: want, Page: want + page}, l.Where(key)); diff != "" {
				t.Errorf("where (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRunsWithoutLiveOutput: a run whose stream the hub refuses (its
// bound on runs taken by runs going) or whose handed-over log cannot
// seed one goes on without live output, and its check names no place
// to read it.
func TestRunsWithoutLiveOutput(t *testing.T) {
	t.Parallel()
	l := live.New(live.Config{Listen: "127.0.0.1:0", Hub: output.HubConfig{MaxRuns: 1}}, runner, filepath.Join(t.TempDir(), "files"), live.Ports{}, nil)
	if l.Open(&job.Job{Key: "first"}, "r1", nil, nil) == nil {
		t.Fatal("the first run: no live output")
	}
	if w := l.Open(&job.Job{Key: key}, "r2", nil, nil); w != nil {
		t.Errorf("a run past the hub's bound: a stream %T, want none", w)
	}
	if got := l.Where(key); got != nil {
		t.Errorf("a run past the hub's bound: where %+v, want nowhere", got)
	}

	l = live.New(live.Config{Listen: "127.0.0.1:0"}, runner, filepath.Join(t.TempDir(), "files"), live.Ports{}, nil)
	if w := l.Open(&job.Job{Key: key}, "r1", []byte("not a cut log"), &run.Handover{LogSize: 1 << 20}); w != nil {
		t.Errorf("an adopted run whose log does not seed: a stream %T, want none", w)
	}
	if got := l.Where(key); got != nil {
		t.Errorf("an adopted run whose log does not seed: where %+v, want nowhere", got)
	}
	if w := l.Open(&job.Job{Key: key}, "r2", nil, nil); w == nil {
		t.Error("the check's next run: no live output (the unseeded stream kept its place)")
	}
}

type fixedTokens struct{}

func (fixedTokens) ServiceAuth(context.Context, string, string, time.Time) (string, error) {
	return "token", nil
}

// TestStopGivesEndedPushesTheirGrace: at a stop, the push of a run that
// ended here gets PushGrace to reach an output service that does not
// answer, then is cancelled and the stop goes on, saying so.
func TestStopGivesEndedPushesTheirGrace(t *testing.T) {
	t.Parallel()
	asked, over := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server sees the client go
		select {
		case asked <- struct{}{}:
		default:
		}
		select { // never answers
		case <-r.Context().Done():
		case <-over:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(over) }) // before the server's close, which waits for the handlers
	var logs syncbuf.Buffer
	const grace = 200 * time.Millisecond
	l := live.New(live.Config{Service: srv.URL, ServiceDID: serviceDID, PushGrace: grace}, runner, filepath.Join(t.TempDir(), "files"),
		live.Ports{Tokens: fixedTokens{}}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	stop := l.Serve()
	j := &job.Job{Key: key}
	if l.Open(j, "r1", nil, nil) == nil {
		t.Fatal("no live output")
	}
	<-asked // the push is in flight
	l.Ended(j, "r1", &run.Result{Status: run.Success}, t.TempDir())
	began := time.Now()
	stop()
	if took := time.Since(began); took < grace || took > grace+10*time.Second {
		t.Errorf("the stop took %v, want the grace (%v) and then no longer than the cancel", took, grace)
	}
	if !strings.Contains(logs.String(), "not all pushed to the output service") {
		t.Errorf("the stop did not say the output was not all pushed; logs:\n%s", logs.String())
	}
}
