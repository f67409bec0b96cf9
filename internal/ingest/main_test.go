package ingest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, knownGoroutines...) }

// knownGoroutines live as long as the process by design and are nobody's
// leak: ipfs/go-log (imported through indigo) starts its log mirror in a
// package initializer, and indigo's CacheDirectory (forge.NewDirectory,
// one per daemon) expires entries in two goroutines of hashicorp's
// expirable LRU that nothing can stop.
var knownGoroutines = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/ipfs/go-log/writer.(*MirrorWriter).logRoutine"),
	goleak.IgnoreTopFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"),
}
