package payload

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBuildRoundTripsHostileValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value string
	}{
		{"plain", "hello"},
		{"quotes", `it's "quoted" ''`},
		{"dollar", "$HOME ${PATH} $(id) `id`"},
		{"newlines", "line1\nline2\n\n"},
		{"backslash", `a\b\\c\n`},
		{"empty", ""},
		{"unicode", "héllo ✓"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			script := dir + "/step"
			writeFile(t, script, `printf %s "$V"`)
			text, err := Build(Step{Secrets: []Var{{"V", tt.value}}, Dir: dir, Script: script})
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", "-s")
			cmd.Stdin = strings.NewReader(text)
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			got, err := cmd.Output()
			if err != nil {
				t.Fatalf("sh: %v", err)
			}
			if diff := cmp.Diff(tt.value, string(got)); diff != "" {
				t.Errorf("value through payload (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		step    Step
		wantErr string
	}{
		{"nul", Step{Secrets: []Var{{"TOKEN", "a\x00b"}}, Script: "/s"}, "variable TOKEN: value contains a NUL byte"},
		{"bad name", Step{Env: []Var{{"A-B", "x"}}, Script: "/s"}, `variable "A-B": not a valid shell variable name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Build(tt.step)
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Build error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestMaskedHidesSecretsOnly(t *testing.T) {
	t.Parallel()
	text, err := Masked(Step{Env: []Var{{"PLAIN", "visible"}}, Secrets: []Var{{"TOKEN", "s3cr3t"}}, Script: "/steps/1"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text, "s3cr3t") || !strings.Contains(text, "export TOKEN='***'") || !strings.Contains(text, "visible") {
		t.Errorf("masked payload wrong:\n%s", text)
	}
}
