package ingest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"knotless.dev/run/tests/pds"
)

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, knownGoroutines...) }

// knownGoroutines live as long as the process by design and are nobody's
// leak: ipfs/go-log (imported through indigo) starts its log mirror in a
// package initializer, and indigo's CacheDirectory (pdsclient.NewDirectory,
// one per daemon) expires entries in two goroutines of hashicorp's
// expirable LRU that nothing can stop.
var knownGoroutines = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/ipfs/go-log/writer.(*MirrorWriter).logRoutine"),
	goleak.IgnoreTopFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"),
}

// startPDS starts a real PDS for the test, skipped under -short; ctx
// ends with the test, or after 5 minutes.
func startPDS(t testing.TB) (context.Context, *pds.Server) {
	t.Helper()
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	return ctx, srv
}
