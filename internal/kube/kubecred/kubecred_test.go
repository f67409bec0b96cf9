package kubecred

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/rest"
)

func jwt(payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(payload)) + ".sig"
}

func TestTokenExpiry(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, token string
		want        time.Time
		wantErr     bool
	}{
		{"exp", jwt(`{"exp":1800000000}`), time.Unix(1800000000, 0).UTC(), false},
		{"no exp", jwt(`{"sub":"x"}`), time.Time{}, true},
		{"not a jwt", "static-token", time.Time{}, true},
	}
	for _, tt := range tests {
		got, err := TokenExpiry(tt.token)
		if (err != nil) != tt.wantErr || !got.Equal(tt.want) {
			t.Errorf("%s: TokenExpiry = %v, %v; want %v (err %v)", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestCheckExpiry(t *testing.T) {
	t.Parallel()
	now := time.Unix(1800000000, 0)
	_, err := CheckExpiry(&rest.Config{BearerToken: jwt(`{"exp":1799999999}`)}, now)
	if !errors.Is(err, ErrExpired) || err.Error() != "runner credentials expired at 2027-01-15T07:59:59Z; the refresh timer may have failed" {
		t.Errorf("expired: %v", err)
	}
	if _, err := CheckExpiry(&rest.Config{BearerToken: jwt(`{"exp":1800000100}`)}, now); err != nil {
		t.Errorf("valid: %v", err)
	}
	if _, err := CheckExpiry(&rest.Config{}, now); err != nil {
		t.Errorf("client certificate: %v", err)
	}
}

func TestCheckExpiryReadsTokenFile(t *testing.T) {
	t.Parallel()
	now := time.Unix(1800000000, 0)
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(jwt(`{"exp":1800000100}`)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The copy read at load has expired; the file holds the rotated token.
	cfg := &rest.Config{BearerToken: jwt(`{"exp":1799999999}`), BearerTokenFile: file}
	exp, err := CheckExpiry(cfg, now)
	if err != nil || exp.Unix() != 1800000100 {
		t.Errorf("CheckExpiry = %v, %v; want the file's exp 1800000100", exp, err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckExpiry(cfg, now); err == nil || errors.Is(err, ErrExpired) {
		t.Errorf("CheckExpiry without the file = %v, want a read error", err)
	}
}

// reviewServer answers SelfSubjectAccessReviews: each right in want is
// allowed from the grantAfter-th review of it on, the rest never.
func reviewServer(t *testing.T, grantAfter int, extra string) (*rest.Config, func() int) {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]int{}
	total := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review authorizationv1.SelfSubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a := review.Spec.ResourceAttributes
		key := Check{Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource}.String()
		mu.Lock()
		seen[key]++
		total++
		n := seen[key]
		mu.Unlock()
		for _, c := range Checks() {
			if c.String() == key {
				review.Status.Allowed = (c.Want && n > grantAfter) || key == extra
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&review)
	}))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json"}}, func() int { mu.Lock(); defer mu.Unlock(); return total }
}

// TestVerifySettledWaitsForNewGrants: rights the authorizer has not
// learned yet are asked again until granted; a right the credential
// must not have fails at once; missing rights fail once settle is over.
func TestVerifySettledWaitsForNewGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	late, _ := reviewServer(t, 2, "")
	if _, err := VerifySettled(ctx, late, "runs", 10*time.Second); err != nil {
		t.Errorf("grants that arrive on the third review: %v", err)
	}
	late, _ = reviewServer(t, 2, "")
	if _, err := Verify(ctx, late, "runs"); err == nil {
		t.Error("Verify without settling passed a credential whose grants had not arrived")
	}
	tooMany, reviews := reviewServer(t, 0, "get secrets")
	_, err := VerifySettled(ctx, tooMany, "runs", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "get secrets: allowed=true, want false") {
		t.Errorf("a right too many: %v, want it named", err)
	}
	if n := reviews(); n != len(Checks()) {
		t.Errorf("a right too many was asked %d reviews, want one round (%d): it must not be waited out", n, len(Checks()))
	}
	never, _ := reviewServer(t, 1000, "")
	if _, err := VerifySettled(ctx, never, "runs", 300*time.Millisecond); err == nil {
		t.Error("rights never granted passed")
	}
}
