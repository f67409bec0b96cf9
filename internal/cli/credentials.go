package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/scheduler"
)

// The files serve reads its secrets from: the app password, the
// operator's secrets and the lander's push credentials, from flags or
// systemd's $CREDENTIALS_DIRECTORY (LoadCredential=), never argv.

// pushCredentials reads the lander's push credentials, each bound to a
// host (and path prefix): --push-credential, repeated. A credential
// bound to nothing stops the start: the file of the older flag's form
// (--push-credential FILE) or its default,
// $CREDENTIALS_DIRECTORY/push-credential, would be offered to whatever
// host a repository record names.
func (c *ServeCmd) pushCredentials(env *Env) (mirror.PushCredentials, error) {
	var creds mirror.PushCredentials
	for _, spec := range c.PushCredentials {
		cred, err := mirror.LoadPushCredential(spec)
		if err != nil {
			return nil, err
		}
		creds = append(creds, cred)
	}
	if dir := env.Getenv("CREDENTIALS_DIRECTORY"); dir != "" {
		name := filepath.Join(dir, "push-credential")
		if _, err := os.Stat(name); err == nil {
			return nil, fmt.Errorf("%s: a push credential bound to no host (the older default of --push-credential) would be offered to "+
				"whatever host a repository record names; load it under another name and bind it: --push-credential HOST=FILE "+
				"or HOST/PATH=FILE (the NixOS module's pushCredentials = [ { host = …; paths = [ … ]; file = …; } ])", name)
		}
	}
	return creds, nil
}

// readPassword reads the app password from --app-password-file, else
// $CREDENTIALS_DIRECTORY/app-password. Without either, a session saved
// in the state directory must do.
func (c *ServeCmd) readPassword(env *Env) (string, error) {
	name := c.AppPasswordFile
	explicit := name != ""
	if !explicit {
		dir := env.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return "", nil
		}
		name = filepath.Join(dir, "app-password")
	}
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("--app-password-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// noPassword says where serve looked for the app password, for a start
// that has none and no saved session (pdsclient.ErrNoPassword), and how to
// give it one.
func (c *ServeCmd) noPassword(env *Env, err error) error {
	if c.AppPasswordFile != "" {
		return fmt.Errorf("%w in --state-dir %s: --app-password-file %s is empty", err, c.StateDir, c.AppPasswordFile)
	}
	where := "CREDENTIALS_DIRECTORY is not set"
	if dir := env.Getenv("CREDENTIALS_DIRECTORY"); dir != "" {
		where = filepath.Join(dir, "app-password") + " does not exist"
	}
	return fmt.Errorf("%w in --state-dir %s: put the runner's app password in a file and name it with --app-password-file FILE "+
		"(default: $CREDENTIALS_DIRECTORY/app-password, as systemd's LoadCredential=app-password:FILE makes it; %s)", err, c.StateDir, where)
}

// readSecrets reads the operator secrets file (its format:
// operatorSecretsFile) and returns its secrets and its name.
func (c *ServeCmd) readSecrets(env *Env) ([]scheduler.OperatorSecret, string, error) {
	name := c.SecretsFile
	explicit := name != ""
	if !explicit {
		dir := env.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return nil, "", nil
		}
		name = filepath.Join(dir, "secrets")
	}
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("--secrets-file: %w", err)
	}
	secrets, err := parseOperatorSecrets(name, b)
	if err != nil {
		err = fmt.Errorf("--secrets-file %s: %w", name, err)
		if errors.As(err, new(*fs.PathError)) {
			return nil, "", err // an entry's file that does not read
		}
		// What the file says is wrong: the operator's configuration,
		// which no restart mends.
		return nil, "", usageError{err}
	}
	return secrets, name, nil
}
