package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
)

// notes collects sd_notify messages.
type notes struct {
	mu   sync.Mutex
	msgs []string
}

func (n *notes) add(s string) {
	n.mu.Lock()
	n.msgs = append(n.msgs, s)
	n.mu.Unlock()
}

func (n *notes) has(prefix string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range n.msgs {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}

// TestHandoverReleasesAtStopWait: at SIGTERM the waiting jobs are
// released at once; a run still going at the stop wait is cancelled and
// marked released (its check goes back to queued for the successor).
func TestHandoverReleasesAtStopWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, _ := testDaemon(t)
		var n notes
		d.cfg.Notify = n.add
		d.cfg.StopWait = time.Minute
		runCtx, stopRuns := context.WithCancel(context.Background())
		defer stopRuns()
		going := pushJob("3k1", "main", "ci")
		d.q.add(going)
		d.q.add(pushJob("3k2", "dev", "ci"))
		var workers sync.WaitGroup
		j, jctx := d.next(t.Context(), runCtx)
		if j != going {
			t.Fatalf("claimed %v", j)
		}
		workers.Go(func() {
			<-jctx.Done() // a run that does not end by itself
			d.jobEnded(j)
		})
		start := time.Now()
		d.handover(&workers, stopRuns)
		if waited := time.Since(start); waited != d.cfg.StopWait {
			t.Errorf("handover took %s, want the stop wait %s", waited, d.cfg.StopWait)
		}
		if !going.released {
			t.Error("the run cancelled at the stop wait is not released")
		}
		if len(d.q.waiting) != 0 || len(d.q.running) != 0 {
			t.Errorf("left %d waiting, %d running", len(d.q.waiting), len(d.q.running))
		}
		for _, want := range []string{"STOPPING=1", "EXTEND_TIMEOUT_USEC=", "STATUS=stopping: 1 running"} {
			if !n.has(want) {
				t.Errorf("no %q notified; got %v", want, n.msgs)
			}
		}
	})
}

// TestHandoverWaitsForRunsToEnd: runs that end within the stop wait
// are not released.
func TestHandoverWaitsForRunsToEnd(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, _ := testDaemon(t)
		d.cfg.StopWait = time.Hour
		runCtx, stopRuns := context.WithCancel(context.Background())
		defer stopRuns()
		d.q.add(pushJob("3k1", "main", "ci"))
		j, _ := d.next(t.Context(), runCtx)
		var workers sync.WaitGroup
		workers.Go(func() {
			time.Sleep(10 * time.Second)
			d.jobEnded(j)
		})
		start := time.Now()
		d.handover(&workers, stopRuns)
		if waited := time.Since(start); waited != 10*time.Second {
			t.Errorf("handover took %s, want 10s", waited)
		}
		if j.released {
			t.Error("a run that ended by itself is released")
		}
	})
}

func TestDegradedStatus(t *testing.T) {
	t.Parallel()
	d, _ := testDaemon(t)
	d.cfg.Executor = nil
	var n notes
	d.cfg.Notify = n.add
	d.faults.executorErr = errors.New("token expired")
	d.status()
	if !n.has("STATUS=0 running, 0 queued; executor degraded: token expired") {
		t.Errorf("status %v", n.msgs)
	}
}

func TestNoteReposSkipsHistory(t *testing.T) {
	t.Parallel()
	d, _ := testDaemon(t)
	repo := forge.Record[forge.Repo]{URI: syntax.ATURI(testRepo)}
	push := func(rkey, ref string) ingest.Event {
		ev := pushEvent("did:plc:owner", rkey)
		ev.Repo, ev.Ref = repo, ref
		return ev
	}
	events := []ingest.Event{push("3k1", "refs/heads/main"), push("3k2", "refs/heads/main"), push("3k3", "refs/heads/dev"), push("3k4", "refs/heads/main")}
	d.noteRepos(&ingest.Snapshot{Repos: []forge.Record[forge.Repo]{repo}, Events: events})
	var done []string
	for k := range saved(t, d).Done {
		done = append(done, k)
	}
	want := []string{events[0].Key(), events[1].Key()}
	if diff := cmp.Diff(want, done, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("done (-want +got):\n%s", diff)
	}
	// Seen already: its next pushes are work, not history.
	d.noteRepos(&ingest.Snapshot{Repos: []forge.Record[forge.Repo]{repo}, Events: append(events, push("3k5", "refs/heads/main"))})
	if got := len(d.st.Done); got != 2 {
		t.Errorf("%d done after a second look, want 2", got)
	}
}
