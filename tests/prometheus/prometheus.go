// Package prometheus starts a real Prometheus for tests: Debian's
// prometheus (tests/prometheus/install), one per test, with a directory
// of its own (configuration and data) under Base, named by a random id
// and held by a lock while the test process lives, on a free loopback
// port. It scrapes the targets it is given every second and evaluates
// the runner's alert rules (monitoring/knotless-run.rules.yml) as often.
// Helpers query its HTTP API (client_golang's api/prometheus/v1).
//
// The server dies with the test process, however that ends (a
// parent-death signal), and the next Start removes what a dead test's
// instance left: its processes (found by their data directory) and its
// directory.
package prometheus

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"knotless.dev/run/tests/internal/hostclean"
)

// Base holds one directory per server, named by its id.
const Base = "/tmp/knotless-prometheus"

// Options say what a server scrapes and evaluates.
type Options struct {
	// Targets are host:port addresses whose /metrics is scraped, as job
	// "knotless-run".
	Targets []string
	// Interval is the scrape and rule evaluation interval; default 1 s.
	Interval time.Duration
	// RuleFiles are the rule files loaded; nil loads RulesFile().
	RuleFiles []string
}

// Server is one running Prometheus.
type Server struct {
	// URL is its address, http://127.0.0.1:PORT.
	URL string
	// API is a client of its HTTP API.
	API v1.API

	id     string
	dir    string
	lock   *os.File
	pid    int
	exited chan struct{}
}

// RulesFile is the path of the runner's alert rules in this checkout.
func RulesFile() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "monitoring", "knotless-run.rules.yml")
}

// Start starts a server for t and stops it (and removes its directory)
// when t ends. Under -short it skips t.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: this test needs a real Prometheus (Debian's prometheus, tests/prometheus/install)")
	}
	if _, err := exec.LookPath("prometheus"); err != nil {
		t.Fatal("prometheus not found: install Debian's prometheus (tests/prometheus/install)")
	}
	if opts.Interval == 0 {
		opts.Interval = time.Second
	}
	if opts.RuleFiles == nil {
		opts.RuleFiles = []string{RulesFile()}
	}
	s, err := create()
	if err != nil {
		t.Fatalf("prometheus: %v", err)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("prometheus: %v", err)
		}
	})
	if err := s.start(opts); err != nil {
		t.Fatalf("prometheus: %v", err)
	}
	return s
}

// create cleans up after dead tests' servers and makes a new server's
// directory and lock, under a lock on Base.
func create() (*Server, error) {
	global, err := hostclean.LockBase(Base)
	if err != nil {
		return nil, err
	}
	defer global.Close()
	if err := hostclean.CleanDead(Base, nil, func(id string) error {
		return (&Server{id: id, dir: filepath.Join(Base, id)}).clean()
	}); err != nil {
		return nil, fmt.Errorf("clean up after earlier servers: %w", err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := &Server{id: hex.EncodeToString(b), exited: make(chan struct{})}
	s.dir = filepath.Join(Base, s.id)
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return nil, err
	}
	if s.lock, err = hostclean.LockDir(s.dir); err != nil || s.lock == nil {
		return nil, errors.Join(fmt.Errorf("lock new server directory %s: %v", s.dir, err), os.RemoveAll(s.dir))
	}
	return s, nil
}

// config is the server's prometheus.yml.
func config(opts Options) string {
	var b strings.Builder
	iv := model.Duration(opts.Interval).String()
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n", iv, iv, iv)
	b.WriteString("rule_files:\n")
	for _, f := range opts.RuleFiles {
		fmt.Fprintf(&b, "  - %q\n", f)
	}
	b.WriteString("scrape_configs:\n  - job_name: knotless-run\n    static_configs:\n      - targets: [")
	for i, tgt := range opts.Targets {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", tgt)
	}
	b.WriteString("]\n")
	return b.String()
}

// start writes the configuration, runs prometheus on a free loopback
// port (trying another when the port was taken meanwhile) and waits
// until it is ready.
func (s *Server) start(opts Options) error {
	cfg := filepath.Join(s.dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config(opts)), 0o600); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := net.JoinHostPort("127.0.0.1", port)
		err = s.run(cfg, addr)
		if err == nil {
			s.URL = "http://" + addr
			c, err := api.NewClient(api.Config{Address: s.URL})
			if err != nil {
				return err
			}
			s.API = v1.NewAPI(c)
			return nil
		}
		if attempt >= 2 || !strings.Contains(s.logTail(), "address already in use") {
			return fmt.Errorf("%w\nlog:\n%s", err, s.logTail())
		}
	}
}

// run starts prometheus listening on addr and waits for /-/ready.
func (s *Server) run(cfg, addr string) error {
	logFile, err := os.Create(filepath.Join(s.dir, "prometheus.log"))
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command("prometheus",
		"--config.file="+cfg,
		"--storage.tsdb.path="+s.dataDir(),
		"--storage.tsdb.retention.time=1h",
		"--web.listen-address="+addr,
		"--log.level=info",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.exited = make(chan struct{})
	if s.pid, err = hostclean.Start(cmd, s.exited); err != nil {
		return fmt.Errorf("start prometheus: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/-/ready", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			s.pid = 0
			return errors.New("prometheus exited at start")
		case <-ctx.Done():
			hostclean.Stop(s.pid, s.exited, 10*time.Second)
			s.pid = 0
			return fmt.Errorf("prometheus not ready at %s within a minute", addr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "prometheus.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// stop stops prometheus and removes the server's directory.
func (s *Server) stop() error {
	hostclean.Stop(s.pid, s.exited, 10*time.Second)
	err := s.clean()
	if s.lock != nil {
		s.lock.Close()
	}
	return err
}

// clean kills what is left of server s.id (found by its data directory
// on its command line) and removes its directory.
func (s *Server) clean() error {
	if err := hostclean.KillAll("prometheus "+s.id, s.pids); err != nil {
		return err
	}
	return os.RemoveAll(s.dir)
}

// pids lists the processes whose command line names the server's data
// directory.
func (s *Server) pids() []int {
	mark := []byte("--storage.tsdb.path=" + s.dataDir() + "\x00")
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmdline, mark) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Query evaluates expr now and returns its instant vector.
func (s *Server) Query(ctx context.Context, expr string) (model.Vector, error) {
	v, _, _, err := s.API.Query(ctx, expr, time.Now())
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %s: a %s, not a vector", expr, v.Type())
	}
	return vec, nil
}

// WaitFor queries expr until done accepts its vector, and returns that
// vector; it fails t after timeout, showing the last answer.
func (s *Server) WaitFor(t testing.TB, expr string, timeout time.Duration, done func(model.Vector) bool) model.Vector {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last model.Vector
	var lastErr error
	for {
		qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
		last, lastErr = s.Query(qctx, expr)
		qcancel()
		if lastErr == nil && done(last) {
			return last
		}
		select {
		case <-ctx.Done():
			t.Fatalf("prometheus: %s: after %s: %v %v\nlog:\n%s", expr, timeout, last, lastErr, s.logTail())
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// WaitValue waits until expr is one series whose value is want.
func (s *Server) WaitValue(t testing.TB, expr string, want float64, timeout time.Duration) *model.Sample {
	t.Helper()
	v := s.WaitFor(t, expr, timeout, func(v model.Vector) bool { return len(v) == 1 && float64(v[0].Value) == want })
	return v[0]
}

// freePort finds a free TCP port on loopback.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}
