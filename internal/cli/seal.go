package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/parts/state"
)

// SecretCmd groups the secret helpers.
type SecretCmd struct {
	Set  SecretSetCmd  `cmd:"" help:"Seal a secret value to a runner's key and write the dev.knotless.secret record with the session of login (or --print it)."`
	Seal SecretSealCmd `cmd:"" help:"Seal a secret value to a runner's key and print the dev.knotless.secret record to write (secret set --print)."`
	Key  SecretKeyCmd  `cmd:"" help:"Make a runner's sealing key pair in DIR/secrets-key.json (the one file replicas share), or keep the one there; print its public half."`
}

// SecretKeyCmd makes the sealing key pair a runner's replicas share
// (serve makes one in its state directory at its first start; replicas
// need one copy of it), and prints the public half repositories seal to.
type SecretKeyCmd struct {
	Dir string `help:"Directory of the key file (secrets-key.json, mode 0600): made if missing; a key there is kept, never replaced." required:"" placeholder:"DIR"`
}

// Run makes or reads the key and prints its public half.
func (c *SecretKeyCmd) Run(env *Env) error {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("--dir %s: %w", c.Dir, err)
	}
	kp, created, err := state.LoadKey(c.Dir)
	if err != nil {
		return fmt.Errorf("--dir %s: %w", c.Dir, err)
	}
	name := filepath.Join(c.Dir, state.KeyFile)
	if created {
		fmt.Fprintf(env.Stderr, "made %s: copy it to every replica (a Secret, or the NixOS module's replicas.sealingKeyFile); its public half, which repositories seal to:\n", name)
	} else {
		fmt.Fprintf(env.Stderr, "kept the key pair in %s; its public half:\n", name)
	}
	_, err = fmt.Fprintln(env.Stdout, kp.PublicString())
	return err
}

// SecretSetCmd seals a secret and writes its record. Its key is derived
// from the repository, the name and the runner, so setting it again
// replaces it.
type SecretSetCmd struct {
	SecretSealCmd `embed:""`
	WriteFlags    `embed:""`
}

// Run seals the value and writes (or prints) the record.
func (c *SecretSetCmd) Run(ctx context.Context, env *Env) error {
	rec, err := c.seal(env)
	if err != nil {
		return err
	}
	_, err = c.write(ctx, env, forge.CollectionSecret, forge.SecretKey(rec.Repo, rec.Name, rec.Runner), rec)
	return err
}

// SecretSealCmd prints a sealed secret record. The value comes from
// stdin, never from the command line. The sealed bytes hold the value
// bound to the repository, name, runner and scope (forge.Envelope), so
// they open for this record's repository only.
type SecretSealCmd struct {
	Runner    string `help:"The runner's DID." required:"" placeholder:"DID"`
	Key       string `help:"The runner's public sealing key (base64, from its secrets-key.json or its log at first start)." required:"" placeholder:"KEY"`
	Repo      string `help:"The repository: at://OWNER/dev.knotless.repo/NAME (OWNER a DID)." required:"" placeholder:"AT-URI"`
	Name      string `help:"The secret's name as workflows grant it." required:"" placeholder:"NAME"`
	Scope     string `help:"Which runs get the value: push (trusted runs; the only scope)." enum:"push" default:"push"`
	ValueFile string `help:"Read the value from FILE instead of stdin." placeholder:"FILE"`
}

// Run seals the value and prints the record as JSON.
func (c *SecretSealCmd) Run(env *Env) error {
	rec, err := c.seal(env)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s\n", b)
	return nil
}

// seal checks the flags, reads the value and seals it into a record.
func (c *SecretSealCmd) seal(env *Env) (forge.Secret, error) {
	if _, err := syntax.ParseDID(c.Runner); err != nil {
		return forge.Secret{}, usageError{fmt.Errorf("--runner: %w", err)}
	}
	if t, err := ingest.ParseTarget(c.Repo); err != nil || !strings.HasPrefix(c.Repo, "at://") || !t.Owner.IsDID() ||
		forge.RepoURI(syntax.DID(t.Owner.String()), t.Name).String() != c.Repo {
		// The sealed envelope is compared byte for byte with the run's
		// repository: the canonical AT-URI, with the owner's DID.
		return forge.Secret{}, usageError{fmt.Errorf("--repo %q: want at://DID/%s/NAME", c.Repo, forge.CollectionRepo)}
	}
	pub, err := forge.DecodeKey(c.Key)
	if err != nil {
		return forge.Secret{}, usageError{fmt.Errorf("--key: %w", err)}
	}
	var value []byte
	if c.ValueFile != "" {
		value, err = os.ReadFile(c.ValueFile)
	} else {
		value, err = readAll(env)
	}
	if err != nil {
		return forge.Secret{}, fmt.Errorf("read the value: %w", err)
	}
	value = []byte(strings.TrimSuffix(string(value), "\n"))
	if len(value) == 0 {
		return forge.Secret{}, errors.New("the value is empty")
	}
	scope := c.Scope
	if scope == "" {
		scope = forge.ScopePush
	}
	sealed, err := forge.SealSecret(pub, forge.Envelope{Repo: c.Repo, Name: c.Name, Runner: c.Runner, Scope: scope, Value: value})
	if err != nil {
		return forge.Secret{}, err
	}
	rec := forge.Secret{Type: forge.CollectionSecret, Repo: c.Repo, Name: c.Name, Runner: c.Runner, Key: c.Key,
		Scope: scope, Sealed: sealed, CreatedAt: forge.Now()}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		return forge.Secret{}, err
	}
	if _, err := cat.Encode(forge.CollectionSecret, rec); err != nil {
		return forge.Secret{}, err
	}
	return rec, nil
}

func readAll(env *Env) ([]byte, error) {
	if env.Stdin == nil {
		return nil, errors.New("no stdin")
	}
	return io.ReadAll(io.LimitReader(env.Stdin, 64<<10))
}
