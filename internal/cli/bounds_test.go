package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"knotless.dev/run/internal/lib/tarstream"
)

// TestRunBoundFlags: the bound flags reach the engine, and the run's
// error names the flag that was passed.
func TestRunBoundFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		flags    []string
		script   string
		wantCode int
		wantOut  string
	}{
		{"outputs", []string{"--max-outputs", "4096"}, `dd if=/dev/zero of="$KNOTLESS_RUN_OUTPUTS/big" bs=1024 count=64 2>/dev/null`, ExitError, "outputs exceed --max-outputs (4096 bytes)"},
		{"files", []string{"--max-files", "3"}, `for i in 1 2 3 4 5; do : > "$KNOTLESS_RUN_OUTPUTS/f$i"; done`, ExitError, "outputs exceed --max-files (3 files)"},
		{"checkout", []string{"--max-checkout", "4096"}, `true`, ExitError, "checkout exceed --max-checkout (4096 bytes)"},
		{"defaults", nil, `dd if=/dev/zero of="$KNOTLESS_RUN_OUTPUTS/big" bs=1024 count=64 2>/dev/null`, ExitSuccess, "success"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			work := filepath.Join(dir, "work")
			mustDo(t, os.MkdirAll(work, 0o755))
			mustDo(t, os.WriteFile(filepath.Join(work, "data"), []byte(strings.Repeat("x", 64<<10)), 0o644))
			steps := filepath.Join(dir, "steps.tsv")
			mustDo(t, os.WriteFile(steps, []byte("write\t"+tt.script+"\n"), 0o644))
			args := append([]string{"run", "--executor", "shell", "--shell-root", filepath.Join(dir, "runs"),
				"--steps-file", steps, "--workdir", work, "--outputs", filepath.Join(dir, "out")}, tt.flags...)
			r := runCLI(t, nil, args...)
			if r.code != tt.wantCode || !strings.Contains(r.stdout, tt.wantOut) {
				t.Errorf("exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", r.code, tt.wantCode, tt.wantOut, r.stdout, r.stderr)
			}
		})
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestTransferBound: the executor's own bound on a transfer is the
// largest the flags allow (it never cuts what the engine or the cache
// store lets through), and a flag at 0 counts as its default, never as
// no bound.
func TestTransferBound(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		flags    BoundFlags
		cacheMax int64
		want     tarstream.Limits
	}{
		{"checkout largest", BoundFlags{MaxCheckout: 5 << 30, MaxOutputs: 1 << 30, MaxFiles: 10}, 1 << 20, tarstream.Limits{MaxBytes: 5 << 30, MaxFiles: 10}},
		{"cache largest", BoundFlags{MaxCheckout: 1 << 20, MaxOutputs: 1 << 20, MaxFiles: 10}, 3 << 30, tarstream.Limits{MaxBytes: 3 << 30, MaxFiles: 10}},
		{"zeros are the defaults", BoundFlags{}, 0, tarstream.Limits{MaxBytes: tarstream.DefaultMaxBytes, MaxFiles: tarstream.DefaultMaxFiles}},
		{"a zero flag is its default, not the others' bound", BoundFlags{MaxCheckout: 0, MaxOutputs: 1 << 20, MaxFiles: 10}, 1 << 20, tarstream.Limits{MaxBytes: tarstream.DefaultMaxBytes, MaxFiles: 10}},
	}
	for _, tt := range tests {
		if got := tt.flags.transfer(tt.cacheMax); got != tt.want {
			t.Errorf("%s: transfer = %+v, want %+v", tt.name, got, tt.want)
		}
	}
	if got := exportBound(0); got != tarstream.DefaultMaxBytes {
		t.Errorf("exportBound(0) = %d, want the default %d", got, tarstream.DefaultMaxBytes)
	}
}
