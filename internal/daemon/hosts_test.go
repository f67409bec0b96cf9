package daemon_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/tests/hostilepds"
)

// TestFailingOwnerPDS: one owner's PDS fails (its records list with 502)
// while another owner's is fine; the healthy owner's push still runs,
// and the failing host is logged and backed off.
func TestFailingOwnerPDS(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	sick, err := srv.CreateAccount(ctx, "sick")
	if err != nil {
		t.Fatal(err)
	}
	w.Put(sick, forge.CollectionRepo, "other", forge.Repo{
		Type: forge.CollectionRepo, Name: "other", Source: "file://" + w.Src.Dir, DefaultBranch: "main",
		Runners: []string{w.Runner.DID.String()}, CreatedAt: forge.Now(),
	})
	// The sick owner's PDS serves its repo record but fails listing.
	proxy := newOutage(t, srv.URL)
	proxy.set(func(r *http.Request, _ []byte) (int, http.Header, string) {
		if strings.HasSuffix(r.URL.Path, "com.atproto.repo.listRecords") {
			return http.StatusBadGateway, nil, "BadGateway"
		}
		return 0, nil, ""
	})
	_, commit := w.Push(map[string]string{".knotless/workflows/test.yaml": workflowFile(`
on: [push]
steps:
  - name: ok
    run: echo fine
`)})
	w.start(w.config(func(c *daemon.Config) {
		// The sick owner first, so its failure comes before the healthy one.
		c.Sources.Targets = []ingest.Target{{Owner: syntax.AtIdentifier(sick.DID), Name: "other"}, {Owner: syntax.AtIdentifier(w.Owner.DID), Name: "hello"}}
		c.Account.Directory = hostilepds.Directory(srv.Directory(), map[syntax.DID]string{sick.DID: proxy.srv.URL})
	}))
	_, got := w.waitFinal("test", commit, 90*time.Second)
	if got.Status != "success" {
		t.Fatalf("healthy owner's check %s (%s), want success", got.Status, got.Error)
	}
	time.Sleep(2 * time.Second) // several reconciles (poll 300 ms)
	log := w.logText()
	if !strings.Contains(log, "owner's PDS failed") || !strings.Contains(log, proxy.srv.URL) {
		t.Errorf("the failing host is not logged:\n%s", log)
	}
	// Backed off: 5 s at first, so within these seconds one try or two.
	if n := proxy.count(); n > 2 {
		t.Errorf("the failing host was asked %d times in a few seconds, want it backed off", n)
	}
}
