package pds_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"

	"knotless.dev/run/tests/pds"
)

// TestServer starts the PDS, makes an account, writes a record of a
// custom type and reads it back: the harness itself works.
func TestServer(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	acct, err := srv.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Directory().LookupDID(ctx, acct.DID); err != nil {
		t.Fatalf("resolve %s through the test PLC: %v", acct.DID, err)
	}
	uri, err := acct.Put(ctx, "dev.knotless.example", "one", map[string]any{"$type": "dev.knotless.example", "n": 1})
	if err != nil {
		t.Fatal(err)
	}
	out, err := agnostic.RepoListRecords(ctx, acct.Client, "dev.knotless.example", "", 10, acct.DID.String(), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Records) != 1 || out.Records[0].Uri != uri.String() {
		t.Fatalf("got records %+v, want one at %s", out.Records, uri)
	}
}

// TestStopStartPDS: a StartSplit server's PDS goes away (requests fail)
// and comes back on the same URL with its accounts, records and the
// sessions it had issued, while the PLC kept resolving its DIDs.
func TestStopStartPDS(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := pds.StartSplit(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	acct, err := srv.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acct.Put(ctx, "dev.knotless.example", "one", map[string]any{"$type": "dev.knotless.example", "n": 1}); err != nil {
		t.Fatal(err)
	}
	url := srv.URL
	if err := srv.StopPDS(); err != nil {
		t.Fatal(err)
	}
	if _, err := acct.Put(ctx, "dev.knotless.example", "two", map[string]any{"$type": "dev.knotless.example", "n": 2}); err == nil {
		t.Fatal("a write succeeded while the PDS was stopped")
	}
	if _, err := srv.Directory().LookupDID(ctx, acct.DID); err != nil {
		t.Fatalf("the PLC stopped resolving %s with the PDS: %v", acct.DID, err)
	}
	if err := srv.StartPDS(ctx); err != nil {
		t.Fatal(err)
	}
	if srv.URL != url {
		t.Errorf("the PDS came back at %s, want %s", srv.URL, url)
	}
	if _, err := acct.Put(ctx, "dev.knotless.example", "two", map[string]any{"$type": "dev.knotless.example", "n": 2}); err != nil {
		t.Fatalf("write with the session from before the outage: %v", err)
	}
	out, err := agnostic.RepoListRecords(ctx, acct.Client, "dev.knotless.example", "", 10, acct.DID.String(), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Records) != 2 {
		t.Fatalf("got %d records after the restart, want 2", len(out.Records))
	}
}

// TestPublicHost: with Options.PublicHost the accounts' DID documents name
// the PDS at that address (a test forwards it), not at localhost.
func TestPublicHost(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := pds.StartWith(ctx, t.TempDir(), pds.Options{PublicHost: "127.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	acct, err := srv.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	id, err := srv.Directory().LookupDID(ctx, acct.DID)
	if err != nil {
		t.Fatal(err)
	}
	if got := id.PDSEndpoint(); got != srv.PublicURL || !strings.HasPrefix(got, "http://127.0.0.2:") {
		t.Errorf("DID document names the PDS at %q, want %q", got, srv.PublicURL)
	}
}
