package clustertest

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// APIProxy is a TCP proxy of the test's own in front of the API server:
// a client given its Kubeconfig loses the API server when the test calls
// Down (every connection through it is cut and new ones are closed at
// once) and has it again after Up, while the cluster and every other
// test go on undisturbed. The API server's certificate names 127.0.0.1,
// so TLS is verified as usual.
type APIProxy struct {
	Kubeconfig string // the admin kubeconfig, pointed at the proxy

	target string
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]struct{}
}

// NewAPIProxy starts a proxy on 127.0.0.1 to the cluster's API server,
// stopped when the test ends.
func (c *Cluster) NewAPIProxy(t testing.TB) *APIProxy {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(c.Kubeconfig)
	if err != nil {
		t.Fatalf("clustertest: API proxy: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("clustertest: API proxy: %v", err)
	}
	p := &APIProxy{target: strings.TrimPrefix(c.Config.Host, "https://"), ln: ln, conns: map[net.Conn]struct{}{}}
	for _, cl := range cfg.Clusters {
		cl.Server = "https://" + ln.Addr().String()
	}
	p.Kubeconfig = filepath.Join(t.TempDir(), "proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p.Kubeconfig); err != nil {
		ln.Close()
		t.Fatalf("clustertest: API proxy: %v", err)
	}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.Down()
		p.wg.Wait()
	})
	return p
}

// Down cuts every connection through the proxy and closes new ones as
// they come, until Up.
func (p *APIProxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// Up lets connections through again.
func (p *APIProxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *APIProxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.wg.Add(1)
		go p.pipe(in)
	}
}

// pipe copies one connection both ways until either end closes or Down
// cuts it.
func (p *APIProxy) pipe(in net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		in.Close()
		return
	}
	p.mu.Unlock()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		in.Close()
		return
	}
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	p.conns[in], p.conns[out] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(out, in)
	go cp(in, out)
	<-done
	in.Close()
	out.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, in)
	delete(p.conns, out)
	p.mu.Unlock()
}
