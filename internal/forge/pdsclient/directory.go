package pdsclient

import (
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
)

// DirectoryConfig says how the runner resolves identities.
type DirectoryConfig struct {
	// PLCURL is the did:plc directory (required: indigo's default is a
	// public host).
	PLCURL string
	// TTL is how long a resolved identity (or handle) is kept (default
	// 10 minutes); a failed resolution is kept for at most a minute.
	TTL time.Duration
	// HTTP is the client for PLC, did:web and well-known requests.
	HTTP *http.Client
}

// DefaultIdentityTTL is how long an identity is cached by default.
const DefaultIdentityTTL = 10 * time.Minute

// identityCapacity bounds the cache: identities are small, and a runner
// meets its owners, its pull authors and, discovering, the accounts of
// one PDS.
const identityCapacity = 100_000

// NewDirectory returns the runner's identity directory. A runner works
// with DIDs: they are resolved through the PLC directory or did:web, and
// a DID's declared handle is not verified (that asks DNS, for a name the
// runner never shows anyone but logs beside the DID). Only a handle named
// on the command line is resolved, over DNS and HTTPS, as asked. Every
// answer is cached for TTL, so a poll resolves nothing it resolved in the
// last TTL.
func NewDirectory(cfg DirectoryConfig) *identity.CacheDirectory {
	ttl := cfg.TTL
	if ttl <= 0 {
		ttl = DefaultIdentityTTL
	}
	base := &identity.BaseDirectory{
		PLCURL:                 strings.TrimSuffix(cfg.PLCURL, "/"),
		SkipHandleVerification: true,
		UserAgent:              "knotless-run",
	}
	base.HTTPClient = http.Client{Timeout: time.Minute}
	if cfg.HTTP != nil {
		base.HTTPClient = *cfg.HTTP
	}
	return identity.NewCacheDirectory(base, identityCapacity, ttl, min(ttl, time.Minute), ttl)
}
