package clustertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Forward listens on listenAddr (host:port, port 0 for any) inside the
// node's network namespace, where every pod can reach the node's own
// addresses (the egress guard drops only what pods send through the node
// to elsewhere), and forwards each connection to target, dialled from the
// test process's network namespace (the host: its loopback, the API
// server). It returns the address it listens on and stops when the test
// ends.
func (c *Cluster) Forward(t testing.TB, listenAddr, target string) string {
	t.Helper()
	if c.Info.NodeNetns == "" {
		t.Fatalf("clustertest: forward: %v", errNoNodeInfo)
	}
	l, err := listenInNetns(c.Info.NodeNetns, listenAddr)
	if err != nil {
		t.Fatalf("clustertest: forward %s to %s: %v", listenAddr, target, err)
	}
	f := &forwarder{l: l, target: target, conns: map[net.Conn]bool{}}
	f.wg.Go(f.serve)
	t.Cleanup(f.close)
	return l.Addr().String()
}

// ForwardToNode forwards a fresh port on the node's address to target
// (see Forward) and returns NodeIP:PORT.
func (c *Cluster) ForwardToNode(t testing.TB, target string) string {
	t.Helper()
	return c.Forward(t, net.JoinHostPort(c.Info.NodeIP, "0"), target)
}

// ServeKubernetesService makes the default namespace's kubernetes Service
// work for pods while the test runs: the harness has no service proxy, so
// a pod's in-cluster configuration (KUBERNETES_SERVICE_HOST, the
// Service's ClusterIP) leads nowhere. It adds the ClusterIP to the node
// namespace's loopback and forwards its port there to the API server,
// whose certificate names the ClusterIP. The address is removed when the
// test ends, unless it was there before.
func (c *Cluster) ServeKubernetesService(t testing.TB) {
	t.Helper()
	ctx := t.Context()
	svc, err := c.Clientset.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("clustertest: the kubernetes Service: %v", err)
	}
	if len(svc.Spec.Ports) == 0 || svc.Spec.ClusterIP == "" {
		t.Fatalf("clustertest: the kubernetes Service has no ClusterIP and port: %+v", svc.Spec)
	}
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		t.Fatalf("clustertest: API server URL %q: %v", c.Config.Host, err)
	}
	ip := svc.Spec.ClusterIP
	out, err := exec.CommandContext(ctx, "ip", "-n", c.Info.NodeNetns, "addr", "add", ip+"/32", "dev", "lo").CombinedOutput()
	switch {
	case err == nil:
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "-n", c.Info.NodeNetns, "addr", "del", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
				t.Errorf("clustertest: remove %s from the node: %v: %s", ip, err, out)
			}
		})
	case strings.Contains(string(out), "File exists"):
		// Another test serves it too: its listener shares the port.
	default:
		t.Fatalf("clustertest: add %s to the node: %v: %s", ip, err, out)
	}
	c.Forward(t, net.JoinHostPort(ip, fmt.Sprint(svc.Spec.Ports[0].Port)), u.Host)
}

// listenInNetns opens a TCP listener in the named network namespace. A
// socket stays in the namespace it was made in; only the locked thread
// that makes it enters the namespace, and that thread ends with its
// goroutine instead of returning to the scheduler.
func listenInNetns(netns, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		f, err := os.Open("/run/netns/" + netns)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if _, _, errno := syscall.RawSyscall(sysSetns, f.Fd(), syscall.CLONE_NEWNET, 0); errno != 0 {
			ch <- result{err: fmt.Errorf("enter netns %s: %w", netns, errno)}
			return
		}
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				// Tests serving the same address share the port.
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1)
			}); err != nil {
				return err
			}
			return serr
		}}
		l, err := lc.Listen(context.Background(), "tcp", addr)
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

type forwarder struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]bool
}

func (f *forwarder) serve() {
	for {
		in, err := f.l.Accept()
		if err != nil {
			return // closed
		}
		f.wg.Go(func() { f.pipe(in) })
	}
}

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = true
	return true
}

func (f *forwarder) pipe(in net.Conn) {
	defer in.Close()
	if !f.track(in) {
		return
	}
	out, err := net.Dial("tcp", f.target)
	if err != nil {
		return
	}
	defer out.Close()
	if !f.track(out) {
		return
	}
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(out, in)
	go cp(in, out)
	<-done
	<-done
}

func (f *forwarder) close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	_ = f.l.Close()
	f.wg.Wait()
}
