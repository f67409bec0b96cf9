package workflow

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCheckRunVars(t *testing.T) {
	t.Parallel()
	many := make([]EnvVar, MaxRunVars+1)
	for i := range many {
		many[i] = EnvVar{Name: fmt.Sprintf("V%d", i), Value: "x"}
	}
	big := strings.Repeat("x", MaxRunVarBytes/2)
	tests := []struct {
		name    string
		vars    []EnvVar
		secrets []string
		want    string // the error, "" for none
	}{
		{"none", nil, nil, ""},
		{"plain", []EnvVar{{"DEBUG", "1"}, {"_x9", "a'b\n$c"}, {"EMPTY", ""}}, []string{"TOKEN"}, ""},
		{"as many as allowed", many[:MaxRunVars], nil, ""},
		{"one too many", many, nil, `run variable "V64": a run takes at most 64 variables`},
		{"leading digit", []EnvVar{{"9A", "x"}}, nil, `run variable "9A": not a shell variable name (letters, digits and _, not starting with a digit)`},
		{"dash", []EnvVar{{"A-B", "x"}}, nil, `run variable "A-B": not a shell variable name (letters, digits and _, not starting with a digit)`},
		{"empty name", []EnvVar{{"", "x"}}, nil, `run variable "": not a shell variable name (letters, digits and _, not starting with a digit)`},
		{"reserved", []EnvVar{{"KNOTLESS_RUN_WORK", "/"}}, nil, `run variable "KNOTLESS_RUN_WORK": KNOTLESS_ is reserved for the runner's variables`},
		{"a granted secret", []EnvVar{{"A", "1"}, {"TOKEN", "x"}}, []string{"TOKEN"}, `run variable "TOKEN": the workflow grants a secret of that name`},
		{"twice", []EnvVar{{"A", "1"}, {"A", "2"}}, nil, `run variable "A": given twice`},
		{"NUL", []EnvVar{{"A", "a\x00b"}}, nil, `run variable "A": the value holds a NUL byte`},
		{"within the bytes", []EnvVar{{"A", big[:len(big)-1]}, {"B", big[:len(big)-1]}}, nil, ""},
		{"over the bytes", []EnvVar{{"A", big}, {"B", big}}, nil, `run variable "B": a run's variables take at most 32768 bytes of names and values`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := CheckRunVars(tt.vars, tt.secrets)
			got := ""
			if err != nil {
				got = err.Error()
				var ve *VarError
				if !errors.As(err, &ve) {
					t.Errorf("error %T is not a *VarError", err)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("CheckRunVars (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDispatchVars(t *testing.T) {
	t.Parallel()
	w, err := Parse("deploy.yaml", []byte(`on:
  dispatch:
    inputs:
      target: {type: choice, options: [staging, production], default: staging}
      dry_run: {type: boolean, default: "true"}
      note: {required: true}
      extra:
      KEY:
secrets: [TOKEN]
steps: [{run: x}]
`))
	if err != nil {
		t.Fatal(err)
	}
	none, err := Parse("plain.yaml", []byte("on: dispatch\nsteps: [{run: x}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		w     *Workflow
		given []EnvVar
		want  []EnvVar
		err   string
	}{
		{"defaults fill in, order is the workflow's", w, []EnvVar{{"note", "hi"}},
			[]EnvVar{{"target", "staging"}, {"dry_run", "true"}, {"note", "hi"}}, ""},
		{"every input given", w, []EnvVar{{"extra", "e"}, {"KEY", "k"}, {"note", ""}, {"dry_run", "false"}, {"target", "production"}},
			[]EnvVar{{"target", "production"}, {"dry_run", "false"}, {"note", ""}, {"extra", "e"}, {"KEY", "k"}}, ""},
		{"required missing", w, nil, nil, `workflow deploy: input "note": required, and not given`},
		{"unknown", w, []EnvVar{{"note", "x"}, {"tagret", "staging"}}, nil, `workflow deploy: input "tagret": not an input of the workflow (known: target, dry_run, note, extra, KEY)`},
		{"no inputs declared", none, []EnvVar{{"A", "1"}}, nil, `workflow plain: input "A": the workflow declares no inputs`},
		{"nothing to give", none, nil, nil, ""},
		{"twice", w, []EnvVar{{"note", "a"}, {"note", "b"}}, nil, `workflow deploy: input "note": given twice`},
		{"bad boolean", w, []EnvVar{{"note", "a"}, {"dry_run", "yes"}}, nil, `workflow deploy: input "dry_run": want true or false, got "yes"`},
		{"bad choice", w, []EnvVar{{"note", "a"}, {"target", "prod"}}, nil, `workflow deploy: input "target": "prod" is not one of the options (staging, production)`},
		{"a NUL in a string", w, []EnvVar{{"note", "a\x00"}}, nil, `run variable "note": the value holds a NUL byte`},
		{"too large", w, []EnvVar{{"note", strings.Repeat("x", MaxRunVarBytes)}}, nil, `run variable "note": a run's variables take at most 32768 bytes of names and values`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.w.DispatchVars(tt.given)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if diff := cmp.Diff(tt.err, gotErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("vars (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseCron(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"* * * * *", "0 3 * * 1-5", "*/15 0-6 1,15 jan-jun sun", "@daily", "@hourly", " 5 4 * * * "} {
		if _, err := ParseCron(ok); err != nil {
			t.Errorf("ParseCron(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "* * * *", "0 0 0 * * *", "60 * * * *", "@every 5m", "TZ=UTC * * * * *", "CRON_TZ=UTC * * * * *", "@reboot"} {
		if _, err := ParseCron(bad); err == nil {
			t.Errorf("ParseCron(%q) accepted", bad)
		}
	}
}
