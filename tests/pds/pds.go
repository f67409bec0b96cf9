// Package pds runs a real atproto PDS (npm @atproto/pds) and an in-memory
// did:plc directory (npm @did-plc/server), both on 127.0.0.1, for the
// integration tests, and makes accounts on it. Install the npm packages
// first with tests/pds/install.sh.
//
// Handles end in .test and do not resolve: tests use DIDs, skip handle
// verification and always set the PLC URL, so nothing asks DNS.
package pds

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/internal/hostclean"
)

// Server is a running PDS and its PLC directory.
type Server struct {
	// URL is the PDS's URL (http://localhost:PORT).
	URL string
	// PublicURL is the PDS's URL in the accounts' DID documents: URL,
	// or http://PublicHost:PORT with Options.PublicHost.
	PublicURL string
	// PLCURL is the did:plc directory's URL.
	PLCURL        string
	AdminPassword string

	dir string
	env []string // the PDS's environment: StartPDS starts it again with it

	procMu sync.Mutex
	pds    *proc // the PDS (and the PLC with it, from Start); nil while stopped
	plc    *proc // the PLC on its own (StartSplit), else nil

	mu     sync.Mutex
	serial int
}

// proc is one node process of start.js.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	logs  *syncbuf.Buffer
	done  chan struct{}
}

// Dir returns this module's directory (where package.json is).
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Installed reports whether the npm packages are installed, and if not,
// what to run.
func Installed() error {
	if _, err := os.Stat(filepath.Join(Dir(), "node_modules", "@atproto", "pds", "package.json")); err != nil {
		return fmt.Errorf("the test PDS is not installed: run tests/pds/install.sh (npm ci)")
	}
	if _, err := exec.LookPath("node"); err != nil {
		return fmt.Errorf("the test PDS needs node on PATH: %w", err)
	}
	return nil
}

// Options change how a PDS starts.
type Options struct {
	// PublicHost is the address the accounts' DID documents name for the
	// PDS, with its port: http://PublicHost:PORT instead of
	// http://localhost:PORT. The PDS still listens on 127.0.0.1 only: the
	// test forwards PublicHost:PORT to it (see PublicURL).
	PublicHost string
	// RateLimits turns the PDS's rate limits on (they are off by
	// default): its answers then carry ratelimit-* headers, and a client
	// over a limit gets 429.
	RateLimits bool
}

// Start starts a PDS with a fresh data directory under dataDir, in one
// process with its PLC directory. Stop it with Stop.
func Start(ctx context.Context, dataDir string) (*Server, error) {
	return start(ctx, dataDir, Options{}, false)
}

// StartWith is Start with options.
func StartWith(ctx context.Context, dataDir string, o Options) (*Server, error) {
	return start(ctx, dataDir, o, false)
}

// StartSplit is Start with the PLC directory and the PDS in two
// processes, so that a test can stop the PDS (StopPDS, a PDS outage) and
// start it again (StartPDS) on the same port and data directory, with
// the same secrets, while the PLC, which keeps its DIDs in memory only,
// stays up.
func StartSplit(ctx context.Context, dataDir string) (*Server, error) {
	return start(ctx, dataDir, Options{}, true)
}

func start(ctx context.Context, dataDir string, o Options, split bool) (*Server, error) {
	if err := Installed(); err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	pdsPort, plcPort := ports[0], ports[1]
	dir, err := os.MkdirTemp(dataDir, "pds-")
	if err != nil {
		return nil, fmt.Errorf("start PDS: %w", err)
	}
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return nil, err
	}
	admin := randomHex(16)
	env := append(os.Environ(),
		"KNOTLESS_PLC_PORT="+strconv.Itoa(plcPort),
		"PDS_PORT="+strconv.Itoa(pdsPort),
		"PDS_HOSTNAME=localhost",
		"PDS_DEV_MODE=true",
		"PDS_DATA_DIRECTORY="+dir,
		"PDS_BLOBSTORE_DISK_LOCATION="+filepath.Join(dir, "blobs"),
		"PDS_DID_PLC_URL=http://127.0.0.1:"+strconv.Itoa(plcPort),
		"PDS_JWT_SECRET="+randomHex(16),
		"PDS_ADMIN_PASSWORD="+admin,
		"PDS_PLC_ROTATION_KEY_K256_PRIVATE_KEY_HEX="+hex.EncodeToString(key.Bytes()),
		"PDS_INVITE_REQUIRED=true",
		"PDS_DISABLE_SSRF_PROTECTION=true",
		"PDS_RATE_LIMITS_ENABLED=false",
		"PDS_CRAWLERS=",
		"PDS_BLOB_UPLOAD_LIMIT=5242880",
		"LOG_ENABLED=false",
	)
	if o.RateLimits {
		env = append(env, "PDS_RATE_LIMITS_ENABLED=true")
	}
	publicURL := "http://localhost:" + strconv.Itoa(pdsPort)
	if o.PublicHost != "" {
		publicURL = "http://" + net.JoinHostPort(o.PublicHost, strconv.Itoa(pdsPort))
		env = append(env, "KNOTLESS_PDS_PUBLIC_URL="+publicURL)
	}
	s := &Server{dir: dir, env: env, AdminPassword: admin, PublicURL: publicURL}
	if !split {
		p, ready, err := startProc(ctx, env, "both")
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		s.pds, s.URL, s.PLCURL = p, ready.PDS, ready.PLC
		return s, nil
	}
	p, ready, err := startProc(ctx, env, "plc")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.plc, s.PLCURL = p, ready.PLC
	if err := s.StartPDS(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// StartPDS starts the PDS of a StartSplit server again after StopPDS, on
// the same port, data directory and secrets.
func (s *Server) StartPDS(ctx context.Context) error {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	if s.plc == nil {
		return errors.New("StartPDS: the server was not started with StartSplit")
	}
	if s.pds != nil {
		return errors.New("StartPDS: the PDS is running")
	}
	p, ready, err := startProc(ctx, s.env, "pds")
	if err != nil {
		return err
	}
	s.pds, s.URL = p, ready.PDS
	return nil
}

// StopPDS stops the PDS of a StartSplit server with SIGKILL, as a crash
// or a lost host would, and keeps its data directory and the PLC.
func (s *Server) StopPDS() error {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	if s.plc == nil {
		return errors.New("StopPDS: the server was not started with StartSplit")
	}
	if s.pds == nil {
		return errors.New("StopPDS: the PDS is not running")
	}
	s.pds.kill()
	s.pds = nil
	return nil
}

// startProc runs start.js in mode (both, plc, pds) and waits for its
// ready line.
func startProc(ctx context.Context, env []string, mode string) (*proc, struct{ PDS, PLC string }, error) {
	var ready struct{ PDS, PLC string }
	cmd := exec.Command("node", filepath.Join(Dir(), "start.js"))
	cmd.Dir = Dir()
	cmd.Env = append(env, "KNOTLESS_START="+mode)
	// Its parent-death signal follows the thread that starts it, so
	// hostclean.Start starts it from a thread no other goroutine can end
	// (clustertest's netns listeners end theirs on purpose).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logs := &syncbuf.Buffer{}
	cmd.Stderr = logs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, ready, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, ready, err
	}
	p := &proc{cmd: cmd, stdin: stdin, logs: logs, done: make(chan struct{})}
	if _, err := hostclean.Start(cmd, p.done); err != nil {
		return nil, ready, fmt.Errorf("start PDS: %w", err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	timeout := time.NewTimer(90 * time.Second)
	defer timeout.Stop()
	select {
	case line, ok := <-lines:
		if !ok {
			<-p.done
			return nil, ready, fmt.Errorf("test PDS (%s) exited before it was ready:\n%s", mode, logs.String())
		}
		if err := json.Unmarshal([]byte(line), &ready); err != nil {
			p.stop()
			return nil, ready, fmt.Errorf("test PDS (%s) said %q: %w\n%s", mode, line, err, logs.String())
		}
	case <-timeout.C:
		p.stop()
		return nil, ready, fmt.Errorf("test PDS (%s) not ready after 90s:\n%s", mode, logs.String())
	case <-ctx.Done():
		p.stop()
		return nil, ready, ctx.Err()
	}
	return p, ready, nil
}

// stop ends the process gracefully (SIGTERM, SIGKILL after 10 s) and
// whatever it left in its process group.
func (p *proc) stop() {
	_ = p.stdin.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// kill ends the process group at once.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	_ = p.stdin.Close()
}

// Logs returns what the PDS (and the PLC) wrote to stderr.
func (s *Server) Logs() string {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	var out string
	for _, p := range []*proc{s.plc, s.pds} {
		if p != nil {
			out += p.logs.String()
		}
	}
	return out
}

// Stop stops the PDS and the PLC directory and removes the data
// directory. It is safe to call more than once.
func (s *Server) Stop() {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	for _, p := range []*proc{s.pds, s.plc} {
		if p != nil {
			p.stop()
		}
	}
	s.pds, s.plc = nil, nil
	_ = os.RemoveAll(s.dir)
}

// Directory returns an identity directory that resolves DIDs through
// this server's PLC and never resolves a handle through DNS.
func (s *Server) Directory() identity.Directory {
	return &identity.BaseDirectory{PLCURL: s.PLCURL, SkipHandleVerification: true}
}

// Account is an account made on the server.
type Account struct {
	DID      syntax.DID
	Handle   string
	Password string
	// Client is logged in with the account's main password.
	Client *atclient.APIClient
}

// CreateAccount makes an account named name (a handle name.test, unique
// on this server) with an invite code from the admin API.
func (s *Server) CreateAccount(ctx context.Context, name string) (*Account, error) {
	s.mu.Lock()
	s.serial++
	handle := fmt.Sprintf("%s%d.test", name, s.serial)
	s.mu.Unlock()
	admin := atclient.NewAdminClient(s.URL, s.AdminPassword)
	var invite struct {
		Code string `json:"code"`
	}
	if err := admin.Post(ctx, "com.atproto.server.createInviteCode", map[string]any{"useCount": 1}, &invite); err != nil {
		return nil, fmt.Errorf("create invite code: %w", err)
	}
	password := randomHex(12)
	c := atclient.NewAPIClient(s.URL)
	var out struct {
		DID string `json:"did"`
	}
	err := c.Post(ctx, "com.atproto.server.createAccount", map[string]any{
		"handle":     handle,
		"email":      handle + "@example.com",
		"password":   password,
		"inviteCode": invite.Code,
	}, &out)
	if err != nil {
		return nil, fmt.Errorf("create account %s: %w", handle, err)
	}
	did, err := syntax.ParseDID(out.DID)
	if err != nil {
		return nil, err
	}
	client, err := atclient.LoginWithPasswordHost(ctx, s.URL, did.String(), password, "", nil)
	if err != nil {
		return nil, fmt.Errorf("log in as %s: %w", handle, err)
	}
	return &Account{DID: did, Handle: handle, Password: password, Client: client}, nil
}

// AppPassword makes an app password for the account.
func (a *Account) AppPassword(ctx context.Context, name string) (string, error) {
	var out struct {
		Password string `json:"password"`
	}
	if err := a.Client.Post(ctx, "com.atproto.server.createAppPassword", map[string]any{"name": name}, &out); err != nil {
		return "", fmt.Errorf("create app password: %w", err)
	}
	return out.Password, nil
}

// Put writes record (a JSON-able value with its $type) at
// collection/rkey of the account's repo, without PDS-side validation.
func (a *Account) Put(ctx context.Context, collection, rkey string, record any) (syntax.ATURI, error) {
	b, err := json.Marshal(record)
	if err != nil {
		return "", err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	if rkey == "" {
		rkey = syntax.NewTIDNow(0).String()
	}
	validate := false
	out, err := agnostic.RepoPutRecord(ctx, a.Client, &agnostic.RepoPutRecord_Input{
		Collection: collection, Repo: a.DID.String(), Rkey: rkey, Record: m, Validate: &validate,
	})
	if err != nil {
		return "", fmt.Errorf("put %s/%s: %w", collection, rkey, err)
	}
	return syntax.ATURI(out.Uri), nil
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ErrSkip is the reason integration tests skip under -short.
var ErrSkip = errors.New("integration test: skipped under -short (it starts a real PDS)")

// OwnerAndRunner makes the two accounts every runner test starts from: a
// repository owner, and a runner with an app password named app.
func (s *Server) OwnerAndRunner(ctx context.Context, app string) (owner, runner *Account, password string, err error) {
	if owner, err = s.CreateAccount(ctx, "owner"); err != nil {
		return nil, nil, "", err
	}
	if runner, err = s.CreateAccount(ctx, "runner"); err != nil {
		return nil, nil, "", err
	}
	if password, err = runner.AppPassword(ctx, app); err != nil {
		return nil, nil, "", err
	}
	return owner, runner, password, nil
}
