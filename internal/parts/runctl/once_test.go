package runctl

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/lib/onceset"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/parts/rig"
)

// A flood of 100,000 strangers' cancel records, each from a new
// account, refused at every reconcile: what run control remembers of them
// stays within its bound, the log says at most maxRefusalsLogged of
// them one by one and counts the rest, and the owner's check is left
// as it is.
func TestRefusedRecordsAreBounded(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.git.SetWorkflows(rig.CI("ci", "make"))
	push := rig.Push("3k1", "c1")
	w.lister.Set(push)
	w.reconcile(t)
	key := forge.CheckKey(push.Subject(), "ci")
	var flood []forge.Record[forge.Cancel]
	for i := range 100_000 {
		flood = append(flood, rig.CancelOf(fmt.Sprintf("did:plc:stranger%07d", i), "c1", key))
	}
	w.lister.SetControls(ingest.Controls{Cancels: flood})
	log := &syncbuf.Buffer{}
	w.log = slog.New(slog.NewTextHandler(log, nil))
	w.join()
	w.reconcile(t)
	if n := w.rc.once.Len(); n > onceset.DefaultMax {
		t.Errorf("run control remembers %d things after the flood, more than its bound, %d", n, onceset.DefaultMax)
	}
	if n := strings.Count(log.String(), "run-control record refused"); n > maxRefusalsLogged {
		t.Errorf("%d refusals logged one by one in a reconcile, want at most %d", n, maxRefusalsLogged)
	}
	if !strings.Contains(log.String(), "more=99900") {
		t.Errorf("the log does not count the refusals it did not say one by one")
	}
	if got := w.pds.Statuses(key); !slices.Equal(got, []string{"queued"}) {
		t.Errorf("the owner's check after the flood: %v", got)
	}
}
