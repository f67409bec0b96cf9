package kubecred

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

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
