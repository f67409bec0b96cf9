package clustertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
// test ends, unless another test still serves it.
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
	c.addNodeAddress(t, ip)
	c.Forward(t, net.JoinHostPort(ip, fmt.Sprint(svc.Spec.Ports[0].Port)), u.Host)
}

// ServeOnNodeAddress gives the node namespace's loopback the address ip
// (a TEST-NET address such as 198.51.100.7 stands for "the public
// internet"; 169.254.169.254 for a cloud's metadata service) and serves
// a fresh port of it in the node namespace: each connection is answered
// with "hello from IP" and closed. Pods reach it through their default
// route as the node's own address (INPUT of the node namespace, never
// the egress guard's FORWARD), so only their NetworkPolicy decides
// whether they do. It returns IP:PORT; the listener and the address go
// when the test ends (the address stays while another test serves it).
// Nothing is sent to the real address: it is the node's own while the
// test runs.
func (c *Cluster) ServeOnNodeAddress(t testing.TB, ip string) string {
	t.Helper()
	if c.Info.NodeNetns == "" {
		t.Fatalf("clustertest: serve %s on the node: %v", ip, errNoNodeInfo)
	}
	c.addNodeAddress(t, ip)
	l, err := listenInNetns(c.Info.NodeNetns, net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("clustertest: serve %s on the node: %v", ip, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return // closed
			}
			_, _ = fmt.Fprintf(conn, "hello from %s\n", ip)
			_ = conn.Close()
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
	})
	return l.Addr().String()
}

// addNodeAddress adds ip to the node namespace's loopback until the test
// ends. Tests in other processes may serve the same address (the
// kubernetes Service's ClusterIP, say) at the same time, so the address
// is shared: it is added unless there, and when the test ends it is
// removed only if no listener is left on it (this test's own are closed
// by then: their cleanups run first).
func (c *Cluster) addNodeAddress(t testing.TB, ip string) {
	t.Helper()
	a, err := netip.ParseAddr(ip)
	if err != nil {
		t.Fatalf("clustertest: node address %q: %v", ip, err)
	}
	prefix := netip.PrefixFrom(a, a.BitLen()).String()
	out, err := exec.CommandContext(t.Context(), "ip", "-n", c.Info.NodeNetns, "addr", "add", prefix, "dev", "lo").CombinedOutput()
	// iproute2 says either, by version, when the address is there.
	if err != nil && !strings.Contains(string(out), "File exists") && !strings.Contains(string(out), "Address already assigned") {
		t.Fatalf("clustertest: add %s to the node: %v: %s", ip, err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		src := ip
		if a.Is6() {
			src = "[" + ip + "]"
		}
		listeners, err := inNetns(ctx, c.Info.NodeNetns, "ss", "-Hltn", "src", src)
		if err != nil {
			t.Errorf("clustertest: listeners on %s: %v", ip, err)
			return
		}
		if len(strings.TrimSpace(string(listeners))) > 0 {
			return // another test still serves it
		}
		out, err := exec.CommandContext(ctx, "ip", "-n", c.Info.NodeNetns, "addr", "del", prefix, "dev", "lo").CombinedOutput()
		if err != nil && !strings.Contains(string(out), "Cannot assign requested address") && !strings.Contains(string(out), "Address not found") {
			t.Errorf("clustertest: remove %s from the node: %v: %s", ip, err, out)
		}
	})
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
