package kubernetes

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/internal/lib/atomicfile"
)

// testJWT is an unsigned JWT with an exp claim: all the executor reads.
func testJWT(sub string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(fmt.Appendf(nil, `{"sub":%q,"exp":%d}`, sub, exp.Unix())) + ".sig"
}

// authServer stands in for the API server: it answers /readyz and
// remembers the bearer token of the last request.
type authServer struct {
	mu   sync.Mutex
	last string
}

func (s *authServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.last = r.Header.Get("Authorization")
	s.mu.Unlock()
	fmt.Fprint(w, "ok")
}

func (s *authServer) lastAuth() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// TestRotatedTokenFile: a projected service-account token (in-cluster) or
// a kubeconfig tokenFile is replaced under the running executor. The
// expiry check must judge the token now in the file, never the one read at
// start; and requests must carry the new token once client-go's cached
// file token source re-reads the file (after its one-minute period less
// ten seconds' leeway, so that half runs only without -short).
func TestRotatedTokenFile(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"in-cluster", "kubeconfig tokenFile"} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			srv := &authServer{}
			// TLS: clientcmd sends no credentials to a plain-http server.
			ts := httptest.NewTLSServer(srv)
			t.Cleanup(ts.Close)
			dir := t.TempDir()
			ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
			caFile := filepath.Join(dir, "ca.crt")
			if err := os.WriteFile(caFile, ca, 0o600); err != nil {
				t.Fatal(err)
			}
			tokenFile := filepath.Join(dir, "token")
			old := testJWT("old", time.Now().Add(-time.Minute))
			if err := os.WriteFile(tokenFile, []byte(old), 0o600); err != nil {
				t.Fatal(err)
			}
			creds := Credentials{Namespace: "runs"}
			switch source {
			case "in-cluster":
				// As rest.InClusterConfig builds it: the token read now and its file.
				creds.InCluster = func() (*rest.Config, error) {
					b, err := os.ReadFile(tokenFile)
					return &rest.Config{Host: ts.URL, TLSClientConfig: rest.TLSClientConfig{CAFile: caFile}, BearerToken: string(b), BearerTokenFile: tokenFile}, err
				}
			default:
				kc := filepath.Join(dir, "kubeconfig")
				if err := os.WriteFile(kc, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: {tokenFile: %q}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, ts.URL, caFile, tokenFile), 0o600); err != nil {
					t.Fatal(err)
				}
				creds.Kubeconfig = kc
			}
			ex, err := New(Config{Credentials: creds})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := ex.Health(ctx); !errors.Is(err, kubecred.ErrExpired) {
				t.Fatalf("Health with the expired token = %v, want %v", err, kubecred.ErrExpired)
			}

			// The kubelet rotates the token: written beside, renamed over.
			freshExp := time.Now().Add(time.Hour).Truncate(time.Second)
			fresh := testJWT("fresh", freshExp)
			if err := atomicfile.Write(tokenFile, []byte(fresh), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := ex.Health(ctx); err != nil {
				t.Fatalf("Health after rotation = %v, want nil", err)
			}
			cfg, _, _, err := ex.clients.get()
			if err != nil {
				t.Fatal(err)
			}
			if got, err := kubecred.CheckExpiry(cfg, time.Now()); err != nil || !got.Equal(freshExp) {
				t.Errorf("CheckExpiry after rotation = %v, %v; want the fresh token's exp %v", got, err, freshExp)
			}
			if cfg.BearerTokenFile != tokenFile || cfg.BearerToken != "" {
				t.Errorf("config token = %q, file %q; want no copied token and file %q", cfg.BearerToken, cfg.BearerTokenFile, tokenFile)
			}

			if testing.Short() {
				return
			}
			// client-go caches the file's token for a minute less ten
			// seconds' leeway; no exported knob shortens that.
			deadline := time.Now().Add(75 * time.Second)
			for srv.lastAuth() != "Bearer "+fresh {
				if time.Now().After(deadline) {
					t.Fatalf("requests still carry %q 75s after rotation, want the fresh token", srv.lastAuth())
				}
				time.Sleep(time.Second)
				if err := ex.Health(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestRateLimit: the runner's own limit on its requests (--kube-qps,
// --kube-burst) is on the rest.Config every clientset is built from,
// and the clientset's token bucket has it; none given takes the
// defaults. It holds for a clientset rebuilt after the kubeconfig
// changed too.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		qps       float32
		burst     int
		wantQPS   float32
		wantBurst int
	}{
		{"defaults", 0, 0, DefaultQPS, DefaultBurst},
		{"given", 7, 3, 7, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kc := filepath.Join(t.TempDir(), "kubeconfig")
			write := func(user string) {
				t.Helper()
				// Nothing is asked of the server: loopback, no listener.
				if err := atomicfile.Write(kc, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, user), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write("first")
			ex, err := New(Config{Credentials: Credentials{Kubeconfig: kc, Namespace: "runs"}, QPS: tt.qps, Burst: tt.burst})
			if err != nil {
				t.Fatal(err)
			}
			check := func(when string) {
				t.Helper()
				cfg, cs, _, err := ex.clients.get()
				if err != nil {
					t.Fatal(err)
				}
				if cfg.QPS != tt.wantQPS || cfg.Burst != tt.wantBurst {
					t.Errorf("%s: config QPS %g, burst %d; want %g, %d", when, cfg.QPS, cfg.Burst, tt.wantQPS, tt.wantBurst)
				}
				lim := cs.CoreV1().RESTClient().GetRateLimiter()
				if lim == nil || lim.QPS() != tt.wantQPS {
					t.Errorf("%s: clientset limiter %v, want one of %g a second", when, lim, tt.wantQPS)
				}
			}
			check("at start")
			write("second")
			check("after the kubeconfig changed")
		})
	}
}
