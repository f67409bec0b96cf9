package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/renameio/v2"
	"golang.org/x/term"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/termsafe"
)

// The session login keeps: the app password is sent once, to the PDS's
// createSession, and never kept; the tokens it answers with are kept in
// one file only the user reads (0600 in a 0700 directory), refreshed in
// place when the PDS says the access token has expired.

// savedSession is session.json.
type savedSession struct {
	forge.Session
	// Handle is the identifier login was given, when it was a handle.
	Handle string `json:"handle,omitempty"`
	// PLCURL is the did:plc directory login used: the default of every
	// command's --plc-url after it.
	PLCURL string `json:"plc_url,omitempty"`
}

// sessionPath is CONFIG/knotless-run/session.json, CONFIG being
// $XDG_CONFIG_HOME as the command's environment says (so a test never
// touches the user's), else os.UserConfigDir.
func sessionPath(env *Env) (string, error) {
	dir := ""
	if env.Getenv != nil {
		dir = env.Getenv("XDG_CONFIG_HOME")
	}
	if dir == "" {
		var err error
		if dir, err = os.UserConfigDir(); err != nil {
			return "", fmt.Errorf("find the configuration directory for the session: %w", err)
		}
	}
	return filepath.Join(dir, "knotless-run", "session.json"), nil
}

// errNotLoggedIn is what a command that writes says without a session.
var errNotLoggedIn = errors.New("not logged in: run `knotless-run login DID` (or give --print to print the record instead of writing it)")

func loadSession(env *Env) (*savedSession, string, error) {
	path, err := sessionPath(env)
	if err != nil {
		return nil, "", err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, path, errNotLoggedIn
	}
	if err != nil {
		return nil, path, fmt.Errorf("read the session: %w", err)
	}
	var s savedSession
	if err := json.Unmarshal(b, &s); err != nil || s.RefreshToken == "" || s.Host == "" || s.AccountDID == "" {
		return nil, path, fmt.Errorf("the session in %s is not one login wrote: run `knotless-run login` again", path)
	}
	return &s, path, nil
}

// saveSession writes s to path, 0600, its directory 0700, replacing
// the file whole (a crash leaves the old session or the new one).
func saveSession(path string, s *savedSession) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("keep the session: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("keep the session: %w", err)
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := renameio.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("keep the session: %w", err)
	}
	return nil
}

// ClientFlags are what every command that reads or writes records on
// the network takes.
type ClientFlags struct {
	PLCURL string `name:"plc-url" help:"The did:plc directory to resolve DIDs with (default: the one login used, else https://plc.directory)." placeholder:"URL"`
}

// account is the logged-in account, its session refreshed (and saved)
// when the PDS says the access token has expired.
func account(env *Env) (*pdsclient.Account, error) {
	s, path, err := loadSession(env)
	if err != nil {
		return nil, err
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		return nil, err
	}
	saved := *s
	return pdsclient.Resume(s.Session, func(ns forge.Session) {
		saved.Session = ns
		if err := saveSession(path, &saved); err != nil {
			env.Logger.Warn("the refreshed session could not be kept; the next command logs in again", "err", err)
		}
	}, cat, &http.Client{Timeout: time.Minute}), nil
}

// LoginCmd logs in to the account's PDS with an app password and keeps
// the session.
type LoginCmd struct {
	Account string `arg:"" help:"Your account: its DID (did:plc:… or did:web:…) or handle." placeholder:"DID|HANDLE"`
	PDS     string `name:"pds" help:"Your PDS's URL (default: from your DID document)." placeholder:"URL"`
	PLCURL  string `name:"plc-url" help:"The did:plc directory to resolve your DID with; later commands use it too. (default ${default})" default:"https://plc.directory" placeholder:"URL"`
}

// Help is login --help's text below its usage line.
func (LoginCmd) Help() string {
	return "The app password (make one in your PDS's settings: not your account's password) is read from a prompt " +
		"that does not echo it, or from stdin when stdin is not a terminal; never from the command line or the environment. " +
		"Only the session's tokens are kept, in CONFIG/knotless-run/session.json (0600), CONFIG being $XDG_CONFIG_HOME " +
		"or your system's configuration directory."
}

// Run logs in and keeps the session.
func (c *LoginCmd) Run(ctx context.Context, env *Env) error {
	id, err := syntax.ParseAtIdentifier(c.Account)
	if err != nil {
		return usageError{fmt.Errorf("ACCOUNT %q: want a DID or a handle", c.Account)}
	}
	host := strings.TrimSuffix(c.PDS, "/")
	if host == "" {
		dir := pdsclient.NewDirectory(pdsclient.DirectoryConfig{PLCURL: c.PLCURL})
		ident, err := dir.Lookup(ctx, id)
		if err != nil {
			return fmt.Errorf("resolve %s (or give --pds): %w", c.Account, err)
		}
		if host = ident.PDSEndpoint(); host == "" {
			return fmt.Errorf("%s: no PDS in its DID document (give --pds)", c.Account)
		}
	}
	password, err := readPassword(env, c.Account)
	if err != nil {
		return err
	}
	client, err := atclient.LoginWithPasswordHost(ctx, host, c.Account, password, "", nil)
	if err != nil {
		return fmt.Errorf("log in to %s as %s: %w", host, c.Account, err)
	}
	pa, ok := client.Auth.(*atclient.PasswordAuth)
	if !ok {
		return errors.New("log in: the PDS answered with no session")
	}
	if id.IsDID() && pa.Session.AccountDID.String() != c.Account {
		return fmt.Errorf("log in to %s as %s: the PDS answered for another account, %s", host, c.Account, termsafe.Line(pa.Session.AccountDID.String()))
	}
	s := &savedSession{Session: forge.Session(pa.Session.Clone()), PLCURL: c.PLCURL}
	if id.IsHandle() {
		s.Handle = c.Account
	}
	path, err := sessionPath(env)
	if err != nil {
		return err
	}
	if err := saveSession(path, s); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "Logged in as %s on %s; the session is kept in %s\n", s.AccountDID, termsafe.Line(host), path)
	return nil
}

// readPassword reads the app password: from a prompt on the terminal
// without echo, else the first line of stdin.
func readPassword(env *Env, account string) (string, error) {
	if f, ok := env.Stdin.(interface{ Fd() uintptr }); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprintf(env.Stderr, "App password for %s: ", termsafe.Line(account))
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(env.Stderr)
		if err != nil {
			return "", fmt.Errorf("read the app password: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if env.Stdin == nil {
		return "", errors.New("read the app password: no stdin")
	}
	line, err := bufio.NewReader(io.LimitReader(env.Stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read the app password from stdin: %w", err)
	}
	if line = strings.TrimSpace(line); line == "" {
		return "", errors.New("read the app password: stdin is empty (type it at the prompt, or pipe it in)")
	}
	return line, nil
}

// LogoutCmd ends the session and removes it.
type LogoutCmd struct{}

// Run ends the session on the PDS (a failure there is a warning) and
// removes the file.
func (LogoutCmd) Run(ctx context.Context, env *Env) error {
	s, path, err := loadSession(env)
	if errors.Is(err, errNotLoggedIn) {
		fmt.Fprintln(env.Stdout, "Not logged in.")
		return nil
	}
	if err == nil {
		cat, cerr := pdsclient.NewCatalog()
		if cerr != nil {
			return cerr
		}
		if lerr := pdsclient.Resume(s.Session, nil, cat, &http.Client{Timeout: 30 * time.Second}).Logout(ctx); lerr != nil {
			env.Logger.Warn("the PDS did not end the session; removing it here anyway", "err", lerr)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the session: %w", err)
	}
	fmt.Fprintf(env.Stdout, "Logged out; removed %s\n", path)
	return nil
}
