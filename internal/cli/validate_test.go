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
		{"acted on now: cache, queue, on: batch", "testdata/unacted/later.yaml", []string{
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
			if tt.wantCode == ExitSuccess && strings.Contains(r.stdout, "warning:") {
				t.Errorf("validate warns of a workflow whose fields are all acted on:\n%s", r.stdout)
			}
			if r.code != tt.wantCode {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tt.wantCode, r.stdout, r.stderr)
			}
		})
	}
}

// TestValidateDispatchAndSchedule: validate takes on: dispatch with
// inputs and on: schedule, and names the file, line and column of a bad
// cron expression.
func TestValidateDispatchAndSchedule(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "validate", "testdata/control/deploy.yaml")
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "testdata/control/deploy.yaml: ok") {
		t.Errorf("deploy.yaml: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, nil, "validate", "testdata/control/badcron.yaml")
	want := `testdata/control/badcron.yaml:3:13: on.schedule[0].cron: bad cron expression "0 25 * * *": end of range (25) above maximum (23): 25`
	if r.code != ExitFailure || !strings.Contains(r.stdout, want) {
		t.Errorf("badcron.yaml: exit %d, want 1 and %q\nstdout:\n%s\nstderr:\n%s", r.code, want, r.stdout, r.stderr)
	}
}

// TestValidateMatrix: validate lists a matrix's legs by number (run
// --leg's), refuses leg 257 naming the count, and run --leg runs the
// leg it names.
func TestValidateMatrix(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "validate", "testdata/matrix/test.yaml")
	for _, want := range []string{"testdata/matrix/test.yaml: ok\n", "  leg 1: test (go=1.22, os=linux)\n", "  leg 2: test (go=1.23, os=linux)\n"} {
		if r.code != ExitSuccess || !strings.Contains(r.stdout, want) {
			t.Errorf("test.yaml: exit %d, want 0 and %q\nstdout:\n%s\nstderr:\n%s", r.code, want, r.stdout, r.stderr)
		}
	}
	r = runCLI(t, nil, "validate", "testdata/matrix/big.yaml")
	want := "testdata/matrix/big.yaml:3:3: matrix: 257 legs, more than the limit of 256"
	if r.code != ExitFailure || !strings.Contains(r.stdout, want) {
		t.Errorf("big.yaml: exit %d, want 1 and %q\nstdout:\n%s\nstderr:\n%s", r.code, want, r.stdout, r.stderr)
	}
	r = runCLI(t, nil, "run", "--executor", "shell", "--workflow", "testdata/matrix/test.yaml", "--workdir", t.TempDir(), "--leg", "2")
	if r.code != ExitSuccess || !strings.Contains(r.stdout, "leg go=1.23 os=linux") {
		t.Errorf("run --leg 2: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if r = runCLI(t, nil, "run", "--executor", "shell", "--workflow", "testdata/matrix/test.yaml", "--leg", "3"); r.code != ExitConfig {
		t.Errorf("run --leg 3: exit %d, want %d\nstderr:\n%s", r.code, ExitConfig, r.stderr)
	}
}

// TestValidateNeeds: needs are checked across the workflows of a
// directory, also when one file is given alone; a cycle names its
// workflows in each of them, a missing name is an error at its place.
func TestValidateNeeds(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"testdata/needs/good"}, {"testdata/needs/good/test.yaml"}} {
		r := runCLI(t, nil, append([]string{"validate"}, args...)...)
		if r.code != ExitSuccess || !strings.Contains(r.stdout, "testdata/needs/good/test.yaml: ok") {
			t.Errorf("validate %v: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
		}
	}
	r := runCLI(t, nil, "validate", "testdata/needs/cycle")
	for _, want := range []string{
		`testdata/needs/cycle/a.yaml:2:9: needs: "b" makes a cycle: a → b → a`,
		`testdata/needs/cycle/b.yaml:3:5: needs: "a" makes a cycle: a → b → a`,
		`testdata/needs/cycle/b.yaml:4:5: needs: "gone": no workflow of that name in testdata/needs/cycle (known: a, b)`,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("validate output lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.code != ExitFailure {
		t.Errorf("exit %d, want 1", r.code)
	}
}
