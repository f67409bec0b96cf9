package gitrepo

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server serves the bare repositories under a directory over git's smart
// HTTP (git http-backend) on a loopback address, plain or over TLS, as a forge does: anyone
// may fetch, a push needs HTTP basic auth with User and Password. It
// records every credential offered to it, so that a test can tell what
// a client gave away.
type Server struct {
	// URL is http://ADDR (https://ADDR from ServeTLS), without a
	// trailing slash; a repository DIR under the root is URL/DIR.
	URL string
	// User and Password are what a push must authenticate with.
	User, Password string

	mu       sync.Mutex
	offered  []string
	requests []string
	redirect string
}

// Serve serves the repositories under root on 127.0.0.1 (host "" ) or
// on host (another loopback address, such as 127.0.0.2, which is a host
// of its own to git), on a free port. The server stops when the test
// ends.
func Serve(t testing.TB, host, root string) *Server {
	t.Helper()
	return serve(t, host, root, nil)
}

// ServeTLS is Serve over HTTPS, as a forge serves: URL is https://ADDR,
// with a certificate for the address signed by a test CA of its own,
// which it returns as PEM for the clients to trust (git reads its CA
// bundle from the system's file, so a test binds the PEM over it in a
// mount namespace of its own, or sets GIT_SSL_CAINFO).
func ServeTLS(t testing.TB, host, root string) (*Server, []byte) {
	t.Helper()
	if host == "" {
		host = "127.0.0.1"
	}
	cert, ca, err := testCertificate(net.ParseIP(host))
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, host, root, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), ca
}

// testCertificate makes a CA and a certificate it signs for ip, valid
// for a day; it returns the certificate and the CA as PEM.
func testCertificate(ip net.IP) (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "knotless test git host CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: ip.String()},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{ip}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

func serve(t testing.TB, host, root string, tlsConfig *tls.Config) *Server {
	t.Helper()
	if host == "" {
		host = "127.0.0.1"
	}
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	scheme := "http://"
	if tlsConfig != nil {
		l, scheme = tls.NewListener(l, tlsConfig), "https://"
	}
	s := &Server{URL: scheme + l.Addr().String(), User: "lander", Password: "s3cr3t-push-token"}
	cgiHandler := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}, Stderr: testLog{t}}
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, password, hasAuth := r.BasicAuth()
		s.mu.Lock()
		s.requests = append(s.requests, r.Method+" "+r.URL.RequestURI())
		if hasAuth {
			s.offered = append(s.offered, user+":"+password)
		}
		redirect := s.redirect
		s.mu.Unlock()
		if redirect != "" {
			http.Redirect(w, r, redirect+r.URL.RequestURI(), http.StatusFound)
			return
		}
		push := r.URL.Query().Get("service") == "git-receive-pack" || strings.HasSuffix(r.URL.Path, "/git-receive-pack")
		if push && (!hasAuth || user != s.User || password != s.Password) {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		if push {
			// http-backend takes pushes from an authenticated user only.
			h := *cgiHandler
			h.Env = append(append([]string(nil), cgiHandler.Env...), "REMOTE_USER="+user)
			h.ServeHTTP(w, r)
			return
		}
		cgiHandler.ServeHTTP(w, r)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(l) }()
	t.Cleanup(func() {
		// Shutdown waits for the requests in hand (their http-backend
		// logs to the test), Close for the rest.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		_ = hs.Close()
		<-done
	})
	return s
}

// Offered lists the credentials offered to the server, "USER:PASSWORD",
// in order.
func (s *Server) Offered() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.offered...)
}

// Requests lists the requests the server had, "METHOD URI", in order.
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

// RedirectTo makes the server answer every request with a redirect to
// the same path under url ("": serve again).
func (s *Server) RedirectTo(url string) {
	s.mu.Lock()
	s.redirect = url
	s.mu.Unlock()
}

// testLog is a test's log as a writer (http-backend's stderr).
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log("git http-backend: " + strings.TrimSpace(string(p)))
	return len(p), nil
}
