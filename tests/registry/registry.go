// Package registry starts a private container registry for tests that
// pull images by reference on the test cluster: Debian's docker-registry
// (tests/registry/install), with htpasswd (bcrypt) authentication, plain
// HTTP, bound to the cluster's host-side address (KNOTLESS_TEST_HOST_IP:
// the host's end of the link to the node), so the node's containerd
// reaches it and nothing outside this machine does.
//
// Start tells the node's containerd that the registry is plain HTTP with
// a hosts.toml under the cluster's containerd/certs.d, which containerd
// reads at each pull, and removes it when the test ends. Push copies the
// cluster's run image into the registry under a repository of the test's
// own, so no earlier pull has left it on the node.
package registry

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/internal/hostclean"
)

// User is the registry's one account; its password is random per start.
const User = "knotless"

// Registry is one running registry.
type Registry struct {
	// Host is the registry's address as image references name it,
	// HOST_IP:PORT.
	Host     string
	User     string
	Password string

	c        *clustertest.Cluster
	dir      string
	hostsDir string // containerd's hosts.toml directory for Host
}

// Start starts a registry for t and stops it (and removes its hosts.toml
// and every image pulled from it on the node) when t ends. Under -short
// it skips t.
func Start(t testing.TB, c *clustertest.Cluster) *Registry {
	t.Helper()
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: this test needs a private registry (root, Debian's docker-registry) and the test cluster")
	}
	for _, bin := range []struct{ name, pkg string }{{"docker-registry", "docker-registry"}, {"htpasswd", "apache2-utils"}, {"ctr", "containerd"}} {
		if _, err := exec.LookPath(bin.name); err != nil {
			t.Fatalf("registry: %s not found: install Debian's %s (tests/registry/install)", bin.name, bin.pkg)
		}
	}
	if c.Info.HostIP == "" || c.Info.Dir == "" || c.Info.ContainerdSock == "" {
		t.Fatalf("registry: %s, %s and %s must be set (eval \"$(tests/cluster/env)\")",
			clustertest.EnvHostIP, clustertest.EnvClusterDir, clustertest.EnvContainerdSock)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := &Registry{User: User, Password: randomHex(12), c: c, dir: t.TempDir()}
	port, err := freePort(c.Info.HostIP)
	if err != nil {
		t.Fatalf("registry: %v", err)
	}
	r.Host = net.JoinHostPort(c.Info.HostIP, port)
	if err := r.configure(ctx); err != nil {
		t.Fatalf("registry: %v", err)
	}
	logFile, err := os.Create(filepath.Join(r.dir, "registry.log"))
	if err != nil {
		t.Fatalf("registry: %v", err)
	}
	cmd := exec.Command("docker-registry", "serve", filepath.Join(r.dir, "config.yml"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// It dies with the test process, however that ends (hostclean.Start:
	// from a thread that outlives it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	exited := make(chan struct{})
	_, err = hostclean.Start(cmd, exited)
	go func() {
		<-exited
		logFile.Close()
	}()
	if err != nil {
		t.Fatalf("registry: start docker-registry: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cmd.Process.Kill()
		<-exited
		// What the node pulled from it: the tag and the digest reference
		// (the image ID is shared with the cluster's own image).
		if err := r.removePulled(ctx); err != nil {
			t.Errorf("registry: %v", err)
		}
		if err := os.RemoveAll(r.hostsDir); err != nil {
			t.Errorf("registry: %v", err)
		}
	})
	if err := r.waitUp(ctx, exited); err != nil {
		log, _ := os.ReadFile(filepath.Join(r.dir, "registry.log"))
		t.Fatalf("registry: %v\nlog:\n%s", err, log)
	}
	return r
}

// configure writes the registry's config, its htpasswd file and the
// node's hosts.toml for it.
func (r *Registry) configure(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "htpasswd", "-Bbn", r.User, r.Password).Output()
	if err != nil {
		return fmt.Errorf("htpasswd: %w", err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "htpasswd"), out, 0o600); err != nil {
		return err
	}
	config := fmt.Sprintf(`version: 0.1
log:
  level: info
  accesslog: {disabled: true}
storage:
  filesystem: {rootdirectory: %s}
  delete: {enabled: true}
http:
  addr: %s
  secret: %s
auth:
  htpasswd:
    realm: knotless-test
    path: %s
`, filepath.Join(r.dir, "data"), r.Host, randomHex(16), filepath.Join(r.dir, "htpasswd"))
	if err := os.WriteFile(filepath.Join(r.dir, "config.yml"), []byte(config), 0o600); err != nil {
		return err
	}
	// containerd's CRI reads certs.d/HOST:PORT/hosts.toml at each pull.
	r.hostsDir = filepath.Join(r.c.Info.Dir, "containerd", "certs.d", r.Host)
	if err := os.MkdirAll(r.hostsDir, 0o755); err != nil {
		return err
	}
	hosts := fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", r.Host, r.Host)
	return os.WriteFile(filepath.Join(r.hostsDir, "hosts.toml"), []byte(hosts), 0o644)
}

// waitUp waits until the registry answers (401 without credentials).
func (r *Registry) waitUp(ctx context.Context, exited <-chan struct{}) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.Host+"/v2/", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
			return fmt.Errorf("GET /v2/ without credentials: %s, want 401", resp.Status)
		}
		select {
		case <-exited:
			return errors.New("docker-registry exited")
		case <-ctx.Done():
			return fmt.Errorf("docker-registry did not answer at %s: %w", r.Host, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Push copies the cluster's run image (the archive tests/cluster/up
// imported) into the registry as HOST/knotless/REPO:1 and returns that
// reference. It goes through a containerd namespace of its own, so the
// node's k8s.io namespace does not get the image under that name: a pod
// that uses it has to pull it.
func (r *Registry) Push(t testing.TB, repo string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ref := r.Host + "/knotless/" + repo + ":1"
	ns := "knotless-registry-" + randomHex(4)
	archive := filepath.Join(r.c.Info.Dir, "images", "run.tar")
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, img := range []string{r.c.Image, ref} {
			_ = ctr(ctx, r.c.Info.ContainerdSock, ns, "images", "rm", "--sync", img)
		}
		if err := ctr(ctx, r.c.Info.ContainerdSock, "", "namespaces", "rm", ns); err != nil {
			t.Errorf("registry: %v", err)
		}
	}()
	steps := [][]string{
		{"images", "import", "--no-unpack", archive},
		{"images", "tag", "--force", r.c.Image, ref},
		{"images", "push", "--plain-http", "--user", r.User + ":" + r.Password, ref},
	}
	for _, args := range steps {
		if err := ctr(ctx, r.c.Info.ContainerdSock, ns, args...); err != nil {
			t.Fatalf("registry: push %s: %v", ref, err)
		}
	}
	return ref
}

// DockerConfigJSON is the .dockerconfigjson of a kubernetes.io/dockerconfigjson
// Secret holding the registry's credentials.
func (r *Registry) DockerConfigJSON() []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(r.User + ":" + r.Password))
	b, err := json.Marshal(map[string]any{"auths": map[string]any{
		r.Host: map[string]string{"username": r.User, "password": r.Password, "auth": auth},
	}})
	if err != nil {
		panic(err) // a map of strings always marshals
	}
	return b
}

// removePulled removes every image reference on the node that names
// this registry.
func (r *Registry) removePulled(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", r.c.Info.ContainerdSock, "-n", "k8s.io", "images", "ls", "-q").Output()
	if err != nil {
		return fmt.Errorf("ctr images ls: %w", err)
	}
	var errs []error
	for ref := range strings.Lines(string(out)) {
		ref = strings.TrimSpace(ref)
		if strings.HasPrefix(ref, r.Host+"/") {
			errs = append(errs, ctr(ctx, r.c.Info.ContainerdSock, "k8s.io", "images", "rm", "--sync", ref))
		}
	}
	return errors.Join(errs...)
}

// ctr runs ctr against the node's containerd, in namespace ns (none for
// commands about namespaces themselves).
func ctr(ctx context.Context, sock, ns string, args ...string) error {
	full := []string{"--address", sock}
	if ns != "" {
		full = append(full, "-n", ns)
	}
	full = append(full, args...)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "ctr", full...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// freePort finds a free TCP port on ip.
func freePort(ip string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", fmt.Errorf("find a free port on %s: %w", ip, err)
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
