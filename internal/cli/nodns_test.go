package cli

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// TestServeMakesNoDNSQuery: a whole daemon run (start, a push, its
// check written, SIGTERM) asks no DNS question. The daemon runs in a
// mount namespace of its own whose /etc/resolv.conf names a nameserver
// on a loopback address this test listens on (UDP and TCP port 53), with
// Go's own resolver forced, so any query it made would arrive here.
func TestServeMakesNoDNSQuery(t *testing.T) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: it listens on port 53 and mounts over /etc/resolv.conf in a mount namespace")
	}
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A nameserver address of our own, so that no other test's traffic
	// is counted: 127.A.B.C, all of 127/8 being loopback.
	var b [3]byte
	_, _ = rand.Read(b[:])
	ns := net.IPv4(127, b[0]|1, b[1], b[2]|1)
	var queries atomic.Int64
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ns, Port: 53})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, _, err := udp.ReadFrom(buf); err != nil {
				return
			}
			queries.Add(1)
		}
	}()
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ns, Port: 53})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			queries.Add(1)
			c.Close()
		}
	}()

	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	w := forgeworld.New(t, srv, forgeworld.Options{App: "nodns"})
	owner, runner, password := w.Owner, w.Runner, w.Password
	_, commit := w.Push(map[string]string{
		".knotless/workflows/build.yaml": "on: [push]\nsteps:\n  - name: build\n    run: echo built\n",
	})

	dir := t.TempDir()
	resolvConf := filepath.Join(dir, "resolv.conf")
	writeFile(t, resolvConf, fmt.Sprintf("nameserver %s\noptions timeout:1 attempts:1\n", ns))
	pwFile := filepath.Join(dir, "app-password")
	writeFile(t, pwFile, password+"\n")
	// The PDS is named by its URL, the PLC directory too: nothing in the
	// configuration needs a name resolved.
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", `mount --bind "$0" /etc/resolv.conf && exec "$@"`,
		resolvConf, os.Args[0], "-test.run=^TestServeHelperProcess$", "--",
		"--executor", "shell", "--did", runner.DID.String(), "--pds", srv.URL, "--plc-url", srv.PLCURL,
		"--state-dir", filepath.Join(dir, "state"), "--cache-dir", filepath.Join(dir, "cache"), "--shell-root", t.TempDir(),
		"--poll", "300ms", "--allow-local-sources", "--app-password-file", pwFile, owner.DID.String()+"/hello")
	cmd.Env = append(os.Environ(), "KNOTLESS_SERVE_HELPER=1", "GODEBUG=netdns=go")
	logs := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	cat, _ := pdsclient.NewCatalog()
	reader := &pdsclient.Reader{Dir: srv.Directory(), Catalog: cat}
	built := func() bool {
		recs, _, err := pdsclient.List[forge.Check](ctx, reader, runner.DID, forge.CollectionCheck)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Value.Subject.Commit == commit && r.Value.Status == "success" {
				return true
			}
		}
		return false
	}
	waitFor(t, 2*time.Minute, built, logs.String)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon: %v\n%s", err, logs.String())
	}
	if n := queries.Load(); n != 0 {
		t.Errorf("the daemon sent %d DNS queries (packets or connections to the nameserver of its resolv.conf), want none\n%s", n, logs.String())
	}
}
