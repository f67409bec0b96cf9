// Package hostilepds plays a malicious PDS on loopback for tests: an
// account's PDS that answers as the real PDS behind it does, except for
// its record listings, which never end (Endless) or are never answered
// (Hang). The test PDS (tests/pds) cannot be made to do that; this is
// the one place such a server is faked.
package hostilepds

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Mode is how the server answers com.atproto.repo.listRecords.
type Mode int

const (
	// Endless answers every page at once with one record and a new
	// cursor: the listing never ends.
	Endless Mode = iota
	// Hang holds every listing request until the client gives up.
	Hang
)

// Options shape the server.
type Options struct {
	Mode Mode
	// GiveUpPages (Endless, default 5000) and GiveUpAfter (Hang, default
	// 30 s) end the hostility with HTTP 500, so that a client without
	// bounds fails the test instead of hanging it.
	GiveUpPages int64
	GiveUpAfter time.Duration
	// Held, when set, is called in each held request (Hang) with a
	// context that ends with the request or at GiveUpAfter, before the
	// server waits for that.
	Held func(ctx context.Context)
}

// Server is the hostile PDS.
type Server struct {
	// URL is where it listens.
	URL    string
	o      Options
	listed atomic.Int64
	held   atomic.Int64
}

// Start serves in front of the real PDS at pds; the test's end stops
// it.
func Start(t testing.TB, pds string, o Options) *Server {
	t.Helper()
	if o.GiveUpPages == 0 {
		o.GiveUpPages = 5000
	}
	if o.GiveUpAfter == 0 {
		o.GiveUpAfter = 30 * time.Second
	}
	target, err := url.Parse(pds)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{o: o}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/com.atproto.repo.listRecords") {
			proxy.ServeHTTP(w, r)
			return
		}
		n := s.listed.Add(1)
		switch o.Mode {
		case Endless:
			if n > o.GiveUpPages {
				http.Error(w, `{"error":"GaveUp"}`, http.StatusInternalServerError)
				return
			}
			s.page(w, r, n)
		case Hang:
			s.held.Add(1)
			defer s.held.Add(-1)
			ctx, cancel := context.WithTimeout(r.Context(), o.GiveUpAfter)
			defer cancel()
			if o.Held != nil {
				o.Held(ctx)
			}
			<-ctx.Done()
			if r.Context().Err() == nil {
				http.Error(w, `{"error":"GaveUp"}`, http.StatusInternalServerError)
			}
		}
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// page answers a listing with one well-formed refUpdate record of the
// account asked for (for a repository that does not exist) and a cursor
// to the next page.
func (s *Server) page(w http.ResponseWriter, r *http.Request, n int64) {
	q := r.URL.Query()
	rec := map[string]any{
		"uri": fmt.Sprintf("at://%s/%s/flood%d", q.Get("repo"), q.Get("collection"), n),
		"cid": "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm",
		"value": map[string]any{
			"$type": "dev.knotless.refUpdate", "repo": "at://" + q.Get("repo") + "/dev.knotless.repo/nowhere",
			"ref": "refs/heads/main", "new": strings.Repeat("a", 40), "createdAt": "2024-01-01T00:00:00.000Z",
		},
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"records": []any{rec}, "cursor": fmt.Sprintf("page%d", n)})
}

// Listed is how many listing requests the server took.
func (s *Server) Listed() int64 { return s.listed.Load() }

// Held is how many listing requests it holds now (Hang).
func (s *Server) Held() int64 { return s.held.Load() }

// Directory resolves DIDs through dir, except that the DIDs in moved
// have their PDS at another URL, as if their DID documents said so.
func Directory(dir identity.Directory, moved map[syntax.DID]string) identity.Directory {
	return movedDirectory{Directory: dir, moved: moved}
}

type movedDirectory struct {
	identity.Directory
	moved map[syntax.DID]string
}

func (m movedDirectory) LookupDID(ctx context.Context, did syntax.DID) (*identity.Identity, error) {
	ident, err := m.Directory.LookupDID(ctx, did)
	if err != nil {
		return nil, err
	}
	url, ok := m.moved[did]
	if !ok {
		return ident, nil
	}
	c := *ident
	c.Services = map[string]identity.ServiceEndpoint{}
	for k, v := range ident.Services {
		c.Services[k] = v
	}
	c.Services["atproto_pds"] = identity.ServiceEndpoint{Type: "AtprotoPersonalDataServer", URL: url}
	return &c, nil
}

func (m movedDirectory) Lookup(ctx context.Context, id syntax.AtIdentifier) (*identity.Identity, error) {
	if did, err := id.AsDID(); err == nil {
		return m.LookupDID(ctx, did)
	}
	return m.Directory.Lookup(ctx, id)
}
