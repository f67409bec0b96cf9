package cli

import (
	"strings"
	"testing"
)

// TestValidateWarnsOfFieldsNotActedOn: fields that parse and then do
// nothing are named with file and line; a workflow that never runs
// fails validation, one that only warns passes.
func TestValidateWarnsOfFieldsNotActedOn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		file     string
		want     []string
		wantCode int
	}{
		{"not acted on yet", "testdata/unacted/later.yaml", []string{
			"testdata/unacted/later.yaml:1:12: warning: on: batch is not acted on yet",
			"testdata/unacted/later.yaml:2:8: warning: queue: not acted on yet",
			"testdata/unacted/later.yaml: ok",
		}, ExitSuccess},
		{"never runs", "testdata/unacted/never.yaml", []string{
			"testdata/unacted/never.yaml:1:5: warning: on: no events: this workflow never runs",
		}, ExitFailure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, "validate", tt.file)
			for _, w := range tt.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("validate output lacks %q:\n%s", w, r.stdout)
				}
			}
			if r.code != tt.wantCode {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tt.wantCode, r.stdout, r.stderr)
			}
		})
	}
}
