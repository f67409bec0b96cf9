package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestClassFlagRepeats: each --class is one class, its commas inside
// it, on the command line and as a list in --config (the NixOS module's
// settings.class).
func TestClassFlagRepeats(t *testing.T) {
	t.Parallel()
	want := []string{"large:cpu=4,memory=8Gi,node-selector=pool=big", "small:cpu=1,untrusted"}
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"class": ["large:cpu=4,memory=8Gi,node-selector=pool=big", "small:cpu=1,untrusted"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	root, _, err := parseServe(t, "--class", want[0], "--class", want[1])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, root.Serve.Class); diff != "" {
		t.Errorf("flags (-want +got):\n%s", diff)
	}
	root, _, err = parseServe(t, "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, root.Serve.Class); diff != "" {
		t.Errorf("--config (-want +got):\n%s", diff)
	}
	set, err := root.Serve.classes()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(set.Names(), []string{"default", "large", "small"}); diff != "" {
		t.Errorf("classes (-got +want):\n%s", diff)
	}
}
