package livefollow

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"

	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputservice"
)

// ServiceDID is the test output service's DID: the audience of the
// runner's tokens.
const ServiceDID = "did:web:output.test"

// Service runs the real output service on loopback until the test ends,
// taking output from runner only: it verifies the service-auth tokens
// the runner's PDS mints against the runner's DID document, resolved
// through dir (the test PLC). It returns its URL.
func Service(t testing.TB, runner string, dir identity.Directory) string {
	t.Helper()
	store, err := output.OpenStore(output.StoreConfig{Dir: t.TempDir(), Limits: output.Limits{Head: 8 << 20, Tail: 8 << 20},
		MaxRunsPerRunner: 16, MaxFiles: 10, MaxFileBytes: 1 << 20, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := outputservice.New(outputservice.Config{ServiceDID: ServiceDID, Runners: []string{runner}, Directory: dir, Store: store, Catalog: cat})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}
