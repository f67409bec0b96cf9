package ingest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, KnownGoroutines...) }

// KnownGoroutines are the goroutines that live as long as the process
// and are nobody's leak: ipfs/go-log (imported through indigo) starts
// its log mirror in a package initializer.
var KnownGoroutines = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/ipfs/go-log/writer.(*MirrorWriter).logRoutine"),
}
