package checks

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestWriteBudget: the points left that a PDS's answer to a record write
// says (ratelimit-remaining) are told; reads, and answers without the
// header, are not.
func TestWriteBudget(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("quiet") == "" {
			w.Header().Set("RateLimit-Remaining", "4998")
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	limits := NewRateLimits()
	var told []int
	limits.OnBudget(func(n int) { told = append(told, n) })
	hc := limits.Client(srv.Client())
	for _, req := range []struct{ method, path string }{
		{http.MethodPost, "/xrpc/com.atproto.repo.putRecord"},
		{http.MethodGet, "/xrpc/com.atproto.repo.listRecords"},
		{http.MethodPost, "/xrpc/com.atproto.repo.uploadBlob"},
		{http.MethodPost, "/xrpc/com.atproto.repo.applyWrites?quiet=1"},
		{http.MethodPost, "/xrpc/com.atproto.repo.createRecord"},
	} {
		r, err := http.NewRequest(req.method, srv.URL+req.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if diff := cmp.Diff([]int{4998, 4998}, told); diff != "" {
		t.Errorf("budgets told (-want +got):\n%s", diff)
	}
}
