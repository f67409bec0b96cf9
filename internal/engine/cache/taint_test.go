package cache

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCleanRule: a run's layers are clean only when it was granted no
// secret and everything it restored was clean.
func TestCleanRule(t *testing.T) {
	t.Parallel()
	clean := Layer{Run: "c", Clean: true}
	secret := Layer{Run: "s", Secrets: true}
	inherited := Layer{Run: "i"} // no secret itself, restored a tainted one
	tests := []struct {
		name     string
		secrets  bool
		restored []Layer
		want     bool
	}{
		{"no secret, cold", false, nil, true},
		{"secret, cold", true, nil, false},
		{"no secret, restored a clean layer", false, []Layer{clean}, true},
		{"secret, restored a clean layer", true, []Layer{clean}, false},
		{"no secret, restored a secret-bearing run's layer", false, []Layer{secret}, false},
		{"no secret, restored a layer tainted by its lineage", false, []Layer{inherited}, false},
		{"no secret, one cache clean and another tainted", false, []Layer{clean, secret}, false},
	}
	for _, tt := range tests {
		if got := Clean(tt.secrets, tt.restored); got != tt.want {
			t.Errorf("%s: Clean = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestReadRule: a run granted a secret starts from the base; any other
// from the apart base, and only from a clean layer there.
func TestReadRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		secrets bool
		layer   Layer
		wantRef string
		want    bool
	}{
		{"granted a secret, tainted base", true, Layer{Secrets: true}, baseLink, true},
		{"granted a secret, clean base", true, Layer{Clean: true}, baseLink, true},
		{"no secret, clean apart base", false, Layer{Clean: true}, apartLink, true},
		{"no secret, apart base without the mark (older store)", false, Layer{}, apartLink, false},
		{"no secret, apart base a fault left on a secret-bearing layer", false, Layer{Secrets: true}, apartLink, false},
	}
	for _, tt := range tests {
		ref := readRef(tt.secrets)
		if got := readable(ref, tt.layer); ref != tt.wantRef || got != tt.want {
			t.Errorf("%s: reads %s (readable %v), want %s (%v)", tt.name, ref, got, tt.wantRef, tt.want)
		}
	}
}

// TestPromotionRule: the base takes the newest promoted layer, the apart
// base the newest clean one, and a clean one over an unmarked apart base.
func TestPromotionRule(t *testing.T) {
	t.Parallel()
	l := func(order string, clean bool) *Layer { return &Layer{Run: "r" + order, Order: order, Clean: clean} }
	tests := []struct {
		name                string
		layer               *Layer
		base, apart         *Layer
		wantBase, wantApart bool
	}{
		{"clean, cold store", l("2", true), nil, nil, true, true},
		{"tainted, cold store", l("2", false), nil, nil, true, false},
		{"clean, newer than both", l("3", true), l("2", true), l("2", true), true, true},
		{"tainted, newer than both", l("3", false), l("2", true), l("2", true), true, false},
		{"clean, older than a tainted base, newer than the apart base", l("3", true), l("4", false), l("2", true), false, true},
		{"clean, older than both", l("1", true), l("4", false), l("2", true), false, false},
		{"tainted, older than the base", l("3", false), l("4", false), l("2", true), false, false},
		{"clean, older than an unmarked apart base", l("1", true), l("4", false), l("4", false), false, true},
		{"tainted, over an unmarked apart base", l("5", false), l("4", false), l("4", false), true, false},
	}
	for _, tt := range tests {
		gotBase, gotApart := promotion(*tt.layer, tt.base, tt.apart)
		if gotBase != tt.wantBase || gotApart != tt.wantApart {
			t.Errorf("%s: to base %v, to apart %v; want %v, %v", tt.name, gotBase, gotApart, tt.wantBase, tt.wantApart)
		}
	}
}

// TestTaintFollowsLineage: a push granted no secret that restored what a
// secret-bearing push wrote saves a tainted layer; it may become the
// base, never the apart base, so no pull sees the secret-bearing push's
// files. The marks survive a new Store on the same directory.
func TestTaintFollowsLineage(t *testing.T) {
	t.Parallel()
	s := open(t, Config{})
	restore := func(secrets bool) []Layer {
		t.Helper()
		f, l, err := s.Base(key, secrets)
		if errors.Is(err, ErrCold) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		return []Layer{l}
	}
	// push0: no secret, cold.
	save(t, s, "push0", Layer{Order: "0", Clean: Clean(false, restore(false))}, tarOf(t, "warm", "0"))
	promote(t, s, "push0")
	// push1: granted a secret; writes a file of it.
	save(t, s, "push1", Layer{Order: "1", Secrets: true, Clean: Clean(true, restore(true))}, tarOf(t, "warm", "1", "token", "secret"))
	promote(t, s, "push1")
	// push2: granted no secret, but it restored the base push1 wrote
	// (as a run granted a secret, or an adopted run, may) and saved it on.
	from := restore(true)
	if len(from) != 1 || from[0].Run != "push1" {
		t.Fatalf("push2 restored %+v, want push1's layer", from)
	}
	save(t, s, "push2", Layer{Order: "2", Clean: Clean(false, from)}, tarOf(t, "warm", "2", "token", "secret"))
	if !promote(t, s, "push2") {
		t.Fatal("push2 not promoted to the base")
	}
	if got := baseOf(t, s, true); got != "warm=2,token=secret" {
		t.Errorf("base %q, want push2's layer", got)
	}
	if got := baseOf(t, s, false); got != "warm=0" {
		t.Errorf("a pull reads %q, want push0's layer (push2 inherited push1's taint)", got)
	}
	// push3: granted no secret, starts from the apart base: clean.
	save(t, s, "push3", Layer{Order: "3", Clean: Clean(false, restore(false))}, tarOf(t, "warm", "3"))
	promote(t, s, "push3")
	for _, secrets := range []bool{true, false} {
		if got := baseOf(t, s, secrets); got != "warm=3" {
			t.Errorf("secrets %v: base %q, want push3's layer", secrets, got)
		}
	}

	// The marks are on disk: a new Store (a restarted runner) reads them.
	s2 := open(t, Config{Dir: s.Dir()})
	save(t, s2, "push4", Layer{Order: "4", Secrets: true}, tarOf(t, "token", "secret"))
	promote(t, s2, "push4")
	s3 := open(t, Config{Dir: s.Dir()})
	entries, err := s3.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Base.Run != "push4" || entries[0].Base.Clean || entries[0].Apart.Run != "push3" || !entries[0].Apart.Clean {
		t.Errorf("after a restart: %+v; want base push4 (tainted), apart push3 (clean)", entries)
	}
	if got := baseOf(t, s3, false); got != "warm=3" {
		t.Errorf("after a restart a pull reads %q, want push3's layer", got)
	}
}

// TestOlderStoreIsTainted: a store written before the mark (meta.json
// without "clean") has its apart base refused to runs granted no secret,
// until a clean push replaces it.
func TestOlderStoreIsTainted(t *testing.T) {
	t.Parallel()
	s := open(t, Config{})
	dir := s.keyDir(key)
	stream := tarOf(t, "warm", "old", "token", "secret")
	ldir := filepath.Join(dir, layersDir, "old")
	if err := os.MkdirAll(ldir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The previous version's files, byte for byte in form.
	for name, body := range map[string][]byte{
		filepath.Join(dir, keyFile):   []byte(`{"repo":"` + key.Repo + `","workflow":"ci","path":"/cache"}`),
		filepath.Join(ldir, dataFile): stream,
		filepath.Join(ldir, metaFile): []byte(`{"run":"old","order":"5","bytes":` + strconv.Itoa(len(stream)) + `,"saved":"2026-11-01T00:00:00Z"}`),
	} {
		if err := os.WriteFile(name, body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, ref := range []string{baseLink, apartLink} {
		if err := os.Symlink(layersDir+"/old", filepath.Join(dir, ref)); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := s.Base(key, false)
	if !errors.Is(err, ErrCold) || !strings.Contains(err.Error(), "not marked clean") {
		t.Errorf("a pull on an older store's apart base: %v, want cold, not marked clean", err)
	}
	if got := baseOf(t, s, true); got != "warm=old,token=secret" {
		t.Errorf("a run granted a secret reads %q, want the older store's base", got)
	}
	// A clean push of a lower order than the old base: it takes the
	// apart base only.
	save(t, s, "clean", Layer{Order: "1", Clean: true}, tarOf(t, "warm", "clean"))
	if !promote(t, s, "clean") {
		t.Fatal("the clean push was not promoted")
	}
	if got := baseOf(t, s, false); got != "warm=clean" {
		t.Errorf("a pull reads %q after a clean push, want its layer", got)
	}
	if got := baseOf(t, s, true); got != "warm=old,token=secret" {
		t.Errorf("the base %q, want the older, higher-order one", got)
	}
}
