package daemon_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/tests/hostilepds"
)

// TestHostileOwnerPDS: a watched repository's owner has a PDS that
// pages forever, or never answers, and is listed first; the owner on
// the real PDS still gets its push run, queued by the first or second
// reconcile, and the hostile PDS is logged with the bound it hit.
// (Before the listings were bounded, the endless PDS held the reconcile
// for good, and the silent one for the HTTP client's two minutes a
// page.)
func TestHostileOwnerPDS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		o       hostilepds.Options
		wantLog []string
	}{
		{"pages forever", hostilepds.Options{Mode: hostilepds.Endless, GiveUpPages: 1 << 40},
			[]string{"listing stopped at its bound", "bound=pages"}},
		{"never answers", hostilepds.Options{Mode: hostilepds.Hang, GiveUpAfter: 10 * time.Minute},
			[]string{"owner's PDS failed", "past the listing deadline"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			hostile, err := srv.CreateAccount(context.Background(), "hostile")
			if err != nil {
				t.Fatal(err)
			}
			w.Put(hostile, forge.CollectionRepo, "evil", forge.Repo{Type: forge.CollectionRepo, Name: "evil", Source: "file:///nowhere",
				DefaultBranch: "main", Runners: []string{w.Runner.DID.String()}, CreatedAt: forge.Now()})
			h := hostilepds.Start(t, srv.URL, tc.o)
			_, commit := w.Push(map[string]string{".knotless/workflows/test.yaml": "on: [push]\nsteps:\n  - name: ok\n    run: 'true'\n"})

			// The reconcile that queued the push: how many had listed by
			// the time its first check was written (running: a worker
			// was free).
			var mu sync.Mutex
			queuedIn := 0
			w.start(w.config(func(c *daemon.Config) {
				c.Sources.Targets = []ingest.Target{{Owner: syntax.AtIdentifier(hostile.DID), Name: "evil"}, {Owner: syntax.AtIdentifier(w.Owner.DID), Name: "hello"}}
				c.Account.Directory = hostilepds.Directory(srv.Directory(), map[syntax.DID]string{hostile.DID: h.URL})
				c.Sources.Listing.Bounds.Deadline = 3 * time.Second
				c.OnCheck = func(key string, ch forge.Check) {
					if ch.Subject.Commit == commit {
						mu.Lock()
						if queuedIn == 0 {
							queuedIn = strings.Count(w.logText(), `msg=listed`)
						}
						mu.Unlock()
					}
					w.checkLog.add(key, ch)
				}
			}))
			if _, got := w.waitFinal("test", commit, 90*time.Second); got.Status != "success" {
				t.Errorf("the real owner's push: %s (%s), want success", got.Status, got.Error)
			}
			mu.Lock()
			defer mu.Unlock()
			if queuedIn < 1 || queuedIn > 2 {
				t.Errorf("the push was queued after %d reconciles, want the first or second", queuedIn)
			}
			log := w.logText()
			for _, want := range append(tc.wantLog, "host="+h.URL) {
				if !strings.Contains(log, want) {
					t.Errorf("the log does not say %q", want)
				}
			}
		})
	}
}
