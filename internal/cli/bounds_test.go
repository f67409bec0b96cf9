package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
