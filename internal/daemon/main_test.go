package daemon_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"knotless.dev/run/tests/pds"
)

// srv is the real PDS every test of this package shares; each test makes
// its own accounts on it.
var srv *pds.Server

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Fprintln(os.Stderr, "internal/daemon: integration tests SKIPPED under -short: they need a real PDS (tests/pds)")
		os.Exit(m.Run())
	}
	if err := pds.Installed(); err != nil {
		fmt.Fprintf(os.Stderr, "internal/daemon: %v\n", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	dir, err := os.MkdirTemp("", "knotless-daemon-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv, err = pds.Start(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "internal/daemon: start the test PDS: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	srv.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needPDS(t *testing.T) {
	t.Helper()
	if srv == nil {
		t.Skip(pds.ErrSkip)
	}
}
