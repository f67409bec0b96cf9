package docker

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/syncbuf"
)

// TestIsolationGap is the rule: engines before Docker 28 (Engine API
// 1.48) re-insert their isolation jump at each network create.
func TestIsolationGap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		api string
		gap bool
	}{
		{"1.41", true}, // Docker 20.10, Debian 12's
		{"1.47", true}, // Docker 27
		{"1.48", false},
		{"1.51", false},
	} {
		if got := isolationGap(c.api); got != c.gap {
			t.Errorf("isolationGap(%q) = %v, want %v", c.api, got, c.gap)
		}
	}
}

// TestIsolationGapWarning starts runs on the test daemon (Debian's
// Docker 20.10): with networks of their own and two runs allowed at
// once, the first Start warns once that they are open to each other
// while the engine creates a network, naming the engine's API version
// and what to do; one run at a time, or no network, says nothing.
func TestIsolationGapWarning(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	for _, c := range []struct {
		network     string
		concurrency int
		want        int
	}{
		{NetworkPerRun, 2, 1},
		{NetworkPerRun, 1, 0},
		{NetworkNone, 2, 0},
	} {
		var logs syncbuf.Buffer
		ex := newExecutor(t, d, runner(t), Config{Network: c.network, Concurrency: c.concurrency, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		for _, id := range []string{"gap1", "gap2"} {
			startSession(t, ex, d.Image(), fmt.Sprintf("%s%s%d", id, c.network, c.concurrency), executor.Resources{})
		}
		text := logs.String()
		if n := strings.Count(text, "open to each other"); n != c.want {
			t.Errorf("network %q, concurrency %d: %d warnings, want %d:\n%s", c.network, c.concurrency, n, c.want, text)
		}
		if c.want > 0 && (!strings.Contains(text, "engine_api=1.41") || !strings.Contains(text, "--concurrency 1")) {
			t.Errorf("the warning names neither the engine's API version nor what to do:\n%s", text)
		}
	}
}
