package shell_test

import (
	"os"
	"testing"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/conformance"
	"knotless.dev/run/internal/executor/shell"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{
		New: func(t *testing.T) executor.Executor {
			return shell.New(shell.Config{Root: t.TempDir(), Path: os.Getenv("PATH")})
		},
		// The shell executor's session is its run directory; the run
		// directory's parent is the test's own root.
		SecretSearch: `"$KNOTLESS_RUN_WORK/.."`,
		CachePath:    "cache",
	})
}
