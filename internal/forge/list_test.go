package forge

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"
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
			"$type": CollectionRepo, "name": "hello", "source": "file:///srv/hello",
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
	own := "at://" + asked.String() + "/" + CollectionRepo + "/hello"
	c := hostilePDS(t, []map[string]any{
		repoEntry("at://" + victim + "/" + CollectionRepo + "/hello"),
		repoEntry("at://" + asked.String() + "/" + CollectionPull + "/hello"),
		repoEntry(own),
	})
	recs, bad, err := list[Repo](context.Background(), c, cat, asked, CollectionRepo)
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
	if !strings.Contains(bad[1].Err.Error(), CollectionPull) {
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
	c := hostilePDS(t, []map[string]any{repoEntry("at://did:plc:vwzwgnygau7ed7b7wt5ux7y2/" + CollectionRepo + "/hello")})
	var repo Repo
	_, err = getRecord(context.Background(), c, cat, syntax.ATURI("at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/"+CollectionRepo+"/hello"), &repo)
	if err == nil || !strings.Contains(err.Error(), "did:plc:vwzwgnygau7ed7b7wt5ux7y2") {
		t.Errorf("got %v, want an error naming the record the PDS answered with", err)
	}
}
