package forge

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCheckKey(t *testing.T) {
	t.Parallel()
	s := Subject{Event: "at://did:plc:x/dev.knotless.refUpdate/3n3pa7x34wk22", Commit: strings.Repeat("a", 40)}
	k := CheckKey(s, "build")
	if k != CheckKey(s, "build") || k == CheckKey(s, "test") || len(k) != 26 {
		t.Errorf("key %q: want stable, per workflow, 26 characters", k)
	}
	s2 := s
	s2.Commit = strings.Repeat("b", 40)
	if CheckKey(s2, "build") == k {
		t.Error("a new commit of the same event shares the key")
	}
}

func TestSeal(t *testing.T) {
	t.Parallel()
	kp, err := NewKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := Seal(kp.Public, []byte("v'al\nue"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := kp.Open(sealed)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("v'al\nue", string(got)); diff != "" {
		t.Error(diff)
	}
	other, _ := NewKeyPair()
	if _, err := other.Open(sealed); err == nil {
		t.Error("another key opened the value")
	}
	pub, err := DecodeKey(kp.PublicString())
	if err != nil || pub != kp.Public {
		t.Errorf("key round trip: %v", err)
	}
}

// TestCheckKeyKind: a pull never shares a push's check key, even for the
// same event URI, commit and workflow.
func TestCheckKeyKind(t *testing.T) {
	t.Parallel()
	push := Subject{Kind: KindPush, Event: "at://did:plc:x/dev.knotless.refUpdate/3n3pa7x34wk22", Commit: strings.Repeat("a", 40)}
	pull := push
	pull.Kind = KindPull
	if CheckKey(push, "build") == CheckKey(pull, "build") {
		t.Errorf("push and pull share the key %s", CheckKey(push, "build"))
	}
}

// TestCheckKeyVector pins the key's derivation as docs/design/protocol.md
// states it: the first 16 bytes of sha256(kind "\n" event "\n" commit
// "\n" workflow) in unpadded lower-case base32, 26 characters (not the
// first 26 characters of the whole hash's base32, which differ in the
// last one).
func TestCheckKeyVector(t *testing.T) {
	t.Parallel()
	s := Subject{Kind: KindPush, Event: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.refUpdate/3n3pa7x34wk22", Commit: strings.Repeat("a", 40)}
	// For "lint" the two readings differ: ...wp4 (16 bytes, the key)
	// against ...wp7 (the whole hash's first 26 characters).
	for _, v := range []struct{ workflow, want string }{
		{"build", "rldif7wbzls3iblxc2d3yvg4vu"},
		{"lint", "zsvmur6bdrvdcvafwfoo7mmwp4"},
	} {
		if diff := cmp.Diff(v.want, CheckKey(s, v.workflow)); diff != "" {
			t.Errorf("check key of %s (-want +got):\n%s", v.workflow, diff)
		}
	}
}
