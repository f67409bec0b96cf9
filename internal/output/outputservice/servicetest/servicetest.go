// Package servicetest runs the real output service for tests of the
// parts that talk to it (the pusher, the live part, the service's own
// benchmarks): one runner's key in a directory in memory, the store in
// a temporary directory of the test, served on loopback until the test
// ends. Tests with the real PDS's tokens build the service themselves.
package servicetest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputservice"
)

// Tokens mints the runner's service-auth tokens with its key, as its
// PDS does, and counts them.
type Tokens struct {
	DID syntax.DID
	Key atcrypto.PrivateKey

	mu sync.Mutex
	n  int
}

// ServiceAuth implements the pusher's token source.
func (k *Tokens) ServiceAuth(_ context.Context, aud, lxm string, exp time.Time) (string, error) {
	k.mu.Lock()
	k.n++
	k.mu.Unlock()
	nsid := syntax.NSID(lxm)
	return auth.SignServiceAuth(k.DID, aud, time.Until(exp), &nsid, k.Key)
}

// Count is how many tokens were minted.
func (k *Tokens) Count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n
}

// Config is the service to start: its DID, the runner whose key the
// directory holds, the runners it takes output from (default: that
// one) and the store's bounds (its Dir is the test's).
type Config struct {
	ServiceDID string
	Runner     syntax.DID
	Runners    []string
	Store      output.StoreConfig
	// Service, when set, changes the service's config before it starts
	// (its bounds, timeouts, logger, clock).
	Service func(*outputservice.Config)
}

// Start runs the service until the test ends and returns its URL and
// the runner's tokens.
func Start(tb testing.TB, cfg Config) (string, *Tokens) {
	tb.Helper()
	url, tokens := StartRunners(tb, cfg, cfg.Runner)
	return url, tokens[0]
}

// StartRunners is Start with a key in the directory for each of
// runners (cfg.Runner is not used), all of them taken when cfg.Runners
// is nil; it returns their tokens in the same order.
func StartRunners(tb testing.TB, cfg Config, runners ...syntax.DID) (string, []*Tokens) {
	tb.Helper()
	dir := identity.NewMockDirectory()
	var tokens []*Tokens
	taken := cfg.Runners
	for _, did := range runners {
		key, err := atcrypto.GeneratePrivateKeyK256()
		if err != nil {
			tb.Fatal(err)
		}
		pub, err := key.PublicKey()
		if err != nil {
			tb.Fatal(err)
		}
		dir.Insert(identity.Identity{DID: did, Keys: map[string]identity.VerificationMethod{
			"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()},
		}})
		tokens = append(tokens, &Tokens{DID: did, Key: key})
		if cfg.Runners == nil {
			taken = append(taken, did.String())
		}
	}
	cfg.Store.Dir = tb.TempDir()
	store, err := output.OpenStore(cfg.Store)
	if err != nil {
		tb.Fatal(err)
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		tb.Fatal(err)
	}
	scfg := outputservice.Config{ServiceDID: cfg.ServiceDID, Runners: taken, Directory: dir, Store: store, Catalog: cat}
	if cfg.Service != nil {
		cfg.Service(&scfg)
	}
	svc, err := outputservice.New(scfg)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, ln) }()
	tb.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String(), tokens
}
