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
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
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

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	dir    string
	logs   *syncBuffer
	done   chan struct{}
	mu     sync.Mutex
	serial int
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
}

// Start starts a PDS with a fresh data directory under dataDir. Stop it
// with Stop.
func Start(ctx context.Context, dataDir string) (*Server, error) {
	return StartWith(ctx, dataDir, Options{})
}

// StartWith is Start with options.
func StartWith(ctx context.Context, dataDir string, o Options) (*Server, error) {
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
	publicURL := "http://localhost:" + strconv.Itoa(pdsPort)
	if o.PublicHost != "" {
		publicURL = "http://" + net.JoinHostPort(o.PublicHost, strconv.Itoa(pdsPort))
		env = append(env, "KNOTLESS_PDS_PUBLIC_URL="+publicURL)
	}
	cmd := exec.Command("node", filepath.Join(Dir(), "start.js"))
	cmd.Dir = Dir()
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logs := &syncBuffer{}
	cmd.Stderr = logs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start PDS: %w", err)
	}
	s := &Server{cmd: cmd, stdin: stdin, dir: dir, logs: logs, AdminPassword: admin, PublicURL: publicURL, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	timeout := time.NewTimer(90 * time.Second)
	defer timeout.Stop()
	select {
	case line, ok := <-lines:
		if !ok {
			<-s.done
			return nil, fmt.Errorf("test PDS exited before it was ready:\n%s", logs.String())
		}
		var ready struct{ PDS, PLC string }
		if err := json.Unmarshal([]byte(line), &ready); err != nil {
			s.Stop()
			return nil, fmt.Errorf("test PDS said %q: %w\n%s", line, err, logs.String())
		}
		s.URL, s.PLCURL = ready.PDS, ready.PLC
	case <-timeout.C:
		s.Stop()
		return nil, fmt.Errorf("test PDS not ready after 90s:\n%s", logs.String())
	case <-ctx.Done():
		s.Stop()
		return nil, ctx.Err()
	}
	return s, nil
}

// Logs returns what the PDS wrote to stderr.
func (s *Server) Logs() string { return s.logs.String() }

// Stop stops the PDS and the PLC directory and removes the data
// directory. It is safe to call more than once.
func (s *Server) Stop() {
	_ = s.stdin.Close()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	// Kill whatever the node process left in its group.
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
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

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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
