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
