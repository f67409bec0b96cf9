package pdsclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"knotless.dev/run/internal/forge"
)

// hostilePDS answers listRecords with the given entries and getRecord
// with the first of them, whatever was asked.
func hostilePDS(t *testing.T, entries []map[string]any) *atclient.APIClient {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/com.atproto.repo.listRecords"):
			_ = json.NewEncoder(w).Encode(map[string]any{"records": entries})
		case strings.HasSuffix(r.URL.Path, "/com.atproto.repo.getRecord"):
			_ = json.NewEncoder(w).Encode(entries[0])
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return atclient.NewAPIClient(srv.URL)
}

func repoEntry(uri string) map[string]any {
	return map[string]any{
		"uri": uri,
		"cid": "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm",
		"value": map[string]any{
			"$type": forge.CollectionRepo, "name": "hello", "source": "file:///srv/hello",
			"runners": []string{"did:plc:7u2ld3ffgzqvezmv6wxgxiix"}, "createdAt": "2024-01-01T00:00:00.000Z",
		},
	}
}

// TestListDropsOtherAuthorities: a PDS asked for one account's records
// that answers with a record of another account (or of another
// collection) does not get it listed as the account's: it is returned
// as bad, with the reason.
func TestListDropsOtherAuthorities(t *testing.T) {
	t.Parallel()
	cat, err := NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	asked := syntax.DID("did:plc:ewvi7nxzyoun6zhxrhs64oiz")
	victim := "did:plc:vwzwgnygau7ed7b7wt5ux7y2"
	own := "at://" + asked.String() + "/" + forge.CollectionRepo + "/hello"
	c := hostilePDS(t, []map[string]any{
		repoEntry("at://" + victim + "/" + forge.CollectionRepo + "/hello"),
		repoEntry("at://" + asked.String() + "/" + forge.CollectionPull + "/hello"),
		repoEntry(own),
	})
	recs, bad, err := list[forge.Repo](context.Background(), c, cat, asked, forge.CollectionRepo, ListLimits{}.orDefaults(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].URI.String() != own {
		t.Errorf("listed %v, want only %s", recs, own)
	}
	if len(bad) != 2 {
		t.Fatalf("bad %v, want the other account's record and the other collection's", bad)
	}
	if !strings.Contains(bad[0].Err.Error(), victim) || !strings.Contains(bad[0].Err.Error(), asked.String()) {
		t.Errorf("reason %q: want it to name the record's account and the one asked for", bad[0].Err)
	}
	if !strings.Contains(bad[1].Err.Error(), forge.CollectionPull) {
		t.Errorf("reason %q: want it to name the record's collection", bad[1].Err)
	}
}

// TestGetRefusesAnotherRecord: a getRecord answer for another record
// than the one asked for is an error, not that record's value.
func TestGetRefusesAnotherRecord(t *testing.T) {
	t.Parallel()
	cat, err := NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	c := hostilePDS(t, []map[string]any{repoEntry("at://did:plc:vwzwgnygau7ed7b7wt5ux7y2/" + forge.CollectionRepo + "/hello")})
	var repo forge.Repo
	_, err = getRecord(context.Background(), c, cat, syntax.ATURI("at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/"+forge.CollectionRepo+"/hello"), &repo)
	if err == nil || !strings.Contains(err.Error(), "did:plc:vwzwgnygau7ed7b7wt5ux7y2") {
		t.Errorf("got %v, want an error naming the record the PDS answered with", err)
	}
}

// endlessPDS plays a PDS whose listings never end: every listRecords
// and listRepos answer has perPage entries and a new cursor. It gives
// up (HTTP 500) after giveUp pages, so that a lister without bounds
// fails instead of hanging; asked counts the pages served.
func endlessPDS(t *testing.T, did string, perPage int, giveUp int64) (url string, asked *atomic.Int64) {
	t.Helper()
	asked = &atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := asked.Add(1)
		if n > giveUp {
			http.Error(w, `{"error":"GaveUp"}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/com.atproto.repo.listRecords"):
			var recs []map[string]any
			for i := range perPage {
				recs = append(recs, repoEntry(fmt.Sprintf("at://%s/%s/r%d-%d", did, forge.CollectionRepo, n, i)))
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"records": recs, "cursor": fmt.Sprintf("c%d", n)})
		case strings.HasSuffix(r.URL.Path, "/com.atproto.sync.listRepos"):
			var repos []map[string]any
			for i := range perPage {
				repos = append(repos, map[string]any{"did": fmt.Sprintf("did:plc:spam%dx%d", n, i)})
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"repos": repos, "cursor": fmt.Sprintf("c%d", n)})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, asked
}

// TestListBounds: a PDS whose cursor never ends holds a listing for
// at most its bound of pages, or of records (a PDS may put more on a
// page than asked); the listing returns what it read, with a
// BoundError naming the host, the listing and the bound. The runner's
// own listing (ListOwn) is not bounded.
func TestListBounds(t *testing.T) {
	t.Parallel()
	cat, err := NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	did := syntax.DID("did:plc:ewvi7nxzyoun6zhxrhs64oiz")
	for _, tc := range []struct {
		name      string
		perPage   int
		lim       ListLimits
		wantBound string
		wantLimit int
		wantN     int
		wantPages int64
	}{
		{"pages forever, the default bound", 1, ListLimits{}, "pages", DefaultListPages, DefaultListPages, DefaultListPages},
		{"pages forever", 3, ListLimits{Pages: 4}, "pages", 4, 12, 4},
		{"pages too big", 1000, ListLimits{Records: 250}, "records", 250, 250, 1},
		{"records across pages", 100, ListLimits{Records: 250}, "records", 250, 250, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url, asked := endlessPDS(t, did.String(), tc.perPage, 1000)
			recs, bad, err := list[forge.Repo](t.Context(), atclient.NewAPIClient(url), cat, did, forge.CollectionRepo, tc.lim.orDefaults(), "")
			var be *BoundError
			if !errors.As(err, &be) {
				t.Fatalf("list: got %v after %d pages, want a BoundError", err, asked.Load())
			}
			if be.Bound != tc.wantBound || be.Limit != tc.wantLimit || be.Host != url || !strings.Contains(be.Error(), did.String()) {
				t.Errorf("bound: got %+v (%q), want %s %d on %s naming %s", be, be, tc.wantBound, tc.wantLimit, url, did)
			}
			if got := len(recs) + len(bad); got != tc.wantN {
				t.Errorf("got %d records (%d bad), want the %d read up to the bound", got, len(bad), tc.wantN)
			}
			if got := asked.Load(); got != tc.wantPages {
				t.Errorf("asked for %d pages, want %d", got, tc.wantPages)
			}
		})
	}
	t.Run("listRepos pages forever", func(t *testing.T) {
		t.Parallel()
		url, asked := endlessPDS(t, did.String(), 10, 1000)
		dids, err := ListRepos(t.Context(), nil, url, ListLimits{Pages: 5})
		var be *BoundError
		if !errors.As(err, &be) || be.Bound != "pages" || be.Limit != 5 || len(dids) != 50 || asked.Load() != 5 {
			t.Errorf("got %d accounts, %v after %d pages; want 50, a BoundError of 5 pages, after 5", len(dids), err, asked.Load())
		}
	})
	t.Run("listRepos pages too big", func(t *testing.T) {
		t.Parallel()
		url, _ := endlessPDS(t, did.String(), 1000, 1000)
		dids, err := ListRepos(t.Context(), nil, url, ListLimits{Records: 300})
		var be *BoundError
		if !errors.As(err, &be) || be.Bound != "records" || len(dids) != 300 {
			t.Errorf("got %d accounts, %v; want 300 and a BoundError of records", len(dids), err)
		}
	})
	t.Run("a listing that ends", func(t *testing.T) {
		t.Parallel()
		c := hostilePDS(t, []map[string]any{repoEntry("at://" + did.String() + "/" + forge.CollectionRepo + "/hello")})
		recs, _, err := list[forge.Repo](t.Context(), c, cat, did, forge.CollectionRepo, ListLimits{Pages: 1, Records: 1}.orDefaults(), "")
		if err != nil || len(recs) != 1 {
			t.Errorf("got %d records, %v; want the one record and no error", len(recs), err)
		}
	})
	t.Run("own records", func(t *testing.T) {
		t.Parallel()
		url, asked := endlessPDS(t, did.String(), 1, 2*DefaultListPages)
		_, _, err := list[forge.Repo](t.Context(), atclient.NewAPIClient(url), cat, did, forge.CollectionRepo, unbounded, "")
		if err == nil || asked.Load() <= 2*DefaultListPages {
			t.Errorf("got %v after %d pages; want the unbounded listing to go on until the server gave up", err, asked.Load())
		}
	})
}
