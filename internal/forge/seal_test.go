package forge

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestOpenSecretBinding: a sealed envelope opens only for the record and
// the run it was sealed for; every field is checked, and a value sealed
// in the old form (alone) is refused.
func TestOpenSecretBinding(t *testing.T) {
	t.Parallel()
	kp, err := NewKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	const (
		repoA  = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello"
		repoB  = "at://did:plc:vwzwgnygau7ed7b7wt5ux7y2/dev.knotless.repo/hello"
		runner = "did:plc:7u2ld3ffgzqvezmv6wxgxiix"
		other  = "did:plc:2ehqb3m5xwdufntn5cgb3ymp"
	)
	env := Envelope{Repo: repoA, Name: "TOKEN", Runner: runner, Scope: ScopePush, Value: []byte("v'al\nue\xff")}
	sealed, err := SealSecret(kp.Public, env)
	if err != nil {
		t.Fatal(err)
	}
	old, err := Seal(kp.Public, []byte("v'al\nue"))
	if err != nil {
		t.Fatal(err)
	}
	rec := Secret{Type: CollectionSecret, Repo: repoA, Name: "TOKEN", Runner: runner, Scope: ScopePush, Sealed: sealed}
	got, err := kp.OpenSecret(rec, repoA, runner)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("v'al\nue\xff", string(got)); diff != "" {
		t.Errorf("value (-want +got):\n%s", diff)
	}

	for _, c := range []struct {
		name         string
		mod          func(*Secret)
		repo, runner string
		want         string
	}{
		{"copied into B's record for B's run", func(s *Secret) { s.Repo = repoB }, repoB, runner, "repo"},
		{"A's record, B's run", func(*Secret) {}, repoB, runner, "repo"},
		{"renamed", func(s *Secret) { s.Name = "OTHER" }, repoA, runner, "name"},
		{"record names another runner", func(s *Secret) { s.Runner = other }, repoA, runner, "runner"},
		{"run on another runner", func(*Secret) {}, repoA, other, "runner"},
		{"another scope", func(s *Secret) { s.Scope = "pull" }, repoA, runner, "scope"},
		{"old form", func(s *Secret) { s.Sealed = old }, repoA, runner, "old form"},
		{"not sealed to this key", func(s *Secret) { s.Sealed = append([]byte(nil), sealed[:len(sealed)-1]...) }, repoA, runner, "not sealed"},
	} {
		s := rec
		c.mod(&s)
		v, err := kp.OpenSecret(s, c.repo, c.runner)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %q, %v; want an error about %s", c.name, v, err, c.want)
		}
		if v != nil {
			t.Errorf("%s: a value came back with the error", c.name)
		}
	}
	if _, err := kp.OpenSecret(Secret{Repo: repoA, Name: "TOKEN", Runner: runner, Scope: ScopePush, Sealed: old}, repoA, runner); !errors.Is(err, ErrOldSeal) {
		t.Errorf("old form: got %v, want ErrOldSeal", err)
	}
}
