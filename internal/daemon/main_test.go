package daemon_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"knotless.dev/run/tests/pds"
)

// srv is the real PDS every test of this package shares; each test makes
// its own accounts on it.
var srv *pds.Server

func TestMain(m *testing.M) {
	if landerChild() {
		return
	}
	flag.Parse()
	if testing.Short() {
		fmt.Fprintln(os.Stderr, "internal/daemon: integration tests SKIPPED under -short: they need a real PDS (tests/pds)")
		code := m.Run()
		if code == 0 {
			code = leaks()
		}
		os.Exit(code)
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
	if code == 0 {
		code = leaks()
	}
	os.Exit(code)
}

// leaks fails the package when a test left a goroutine behind: every
// daemon.Run must have waited for what it started. It runs after the
// PDS has stopped (its reader goroutines end with it) and once idle
// keep-alive connections are closed (they are the transport's, not a
// daemon's).
func leaks() int {
	http.DefaultClient.CloseIdleConnections()
	// client-go's websocket exec stream pings every 5 s
	// (remotecommand.heartbeat) and its pinger ends at the first ping
	// after the connection is gone: a stream ended without a close frame
	// leaves it up to 5 s, so goroutines left are looked for again for
	// 7 s before they count.
	var err error
	for deadline := time.Now().Add(7 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if err = findLeaks(); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "internal/daemon: goroutines left behind: %v\n", err)
		return 1
	}
	return 0
}

func findLeaks() error {
	// ipfs/go-log (imported through indigo) starts its log mirror in a
	// package initializer: it lives as long as the process.
	return goleak.Find(goleak.IgnoreTopFunction("github.com/ipfs/go-log/writer.(*MirrorWriter).logRoutine"),
		// client-go keeps one TLS transport per kubeconfig for the
		// process (its transport cache), with a certificate-rotation
		// worker for client certificate files and the HTTP/2
		// connection it holds: process-wide, never a daemon's.
		goleak.IgnoreAnyFunction("k8s.io/client-go/transport.(*dynamicClientCert).run"),
		goleak.IgnoreAnyFunction("k8s.io/client-go/transport.(*dynamicClientCert).runWorker"),
		goleak.IgnoreTopFunction("k8s.io/client-go/util/workqueue.(*delayingType[...]).waitingLoop"),
		goleak.IgnoreTopFunction("k8s.io/apimachinery/pkg/util/wait.waitForWithContext"),
		goleak.IgnoreTopFunction("k8s.io/apimachinery/pkg/util/wait.PollImmediateUntilWithContext.poller.func1.1"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"))
}

func needPDS(t *testing.T) {
	t.Helper()
	if srv == nil {
		t.Skip(pds.ErrSkip)
	}
}
