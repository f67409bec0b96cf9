package run_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/rules/class"
)

func classSet(t *testing.T, specs ...string) class.Set {
	t.Helper()
	set, err := class.ParseSet(specs...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestClasses: a run's session is started in the class its workflow
// names (the default one when it names none), with its requests lowered
// to the class's bounds and the run log saying so; a class the runner
// does not have, or one not open to untrusted work named by a pull, ends
// the run error naming the class before any session starts, whether the
// run is begun ahead (Begin) or not.
func TestClasses(t *testing.T) {
	t.Parallel()
	const steps = "steps:\n  - name: hello\n    run: echo hello\n"
	for _, tc := range []struct {
		name      string
		wf        string
		trusted   bool
		begin     bool
		want      run.Status
		wantErr   string
		wantClass string
		wantRes   executor.Resources
		wantLog   string
	}{
		{name: "none: the default", wf: "on: [pull]\n" + steps, want: run.Success, wantClass: "default"},
		{name: "a pull, a class open to it", wf: "on: [pull]\nclass: small\n" + steps, want: run.Success, wantClass: "small"},
		{name: "clamped, not failed", wf: "on: [push]\nclass: large\nresources: {cpu: '16', memory: 1Gi}\n" + steps, trusted: true, want: run.Success,
			wantClass: "large", wantRes: executor.Resources{CPU: "8", Memory: "1Gi"}, wantLog: "knotless-run: resources.cpu 16 lowered to 8, the bound of class large"},
		{name: "a pull, a class not open to it", wf: "on: [pull]\nclass: large\n" + steps, want: run.Error,
			wantErr: "class large is not open to untrusted runs (pulls); their classes on this runner: default, small"},
		{name: "begun: a pull, a class not open to it", wf: "on: [pull]\nclass: large\n" + steps, begin: true, want: run.Error,
			wantErr: "class large is not open to untrusted runs (pulls)"},
		{name: "a class the runner lacks", wf: "on: [push]\nclass: huge\n" + steps, trusted: true, want: run.Error,
			wantErr: "class huge is not one of this runner's classes: default, large, small"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var specs []executor.Spec
			fake := &fakeexec.Executor{OnStart: func(s executor.Spec) { specs = append(specs, s) }}
			eng := run.New(run.Config{Executor: fake, DefaultImage: "busybox:stable",
				Classes: classSet(t, "large:cpu=8,memory=16Gi,ephemeral-storage=50Gi", "small:cpu=1,untrusted")})
			req := run.Request{RunID: "class", Workflow: parse(t, tc.wf), Checkout: t.TempDir(), Trusted: tc.trusted}
			var res *run.Result
			if tc.begin {
				st := eng.Begin(context.Background(), req)
				res = st.Run(context.Background(), req.Checkout, nil)
			} else {
				res = eng.Run(context.Background(), req)
			}
			if res.Status != tc.want || !strings.Contains(res.Error, tc.wantErr) {
				t.Fatalf("got %s %q, want %s %q\nlog:\n%s", res.Status, res.Error, tc.want, tc.wantErr, res.Log)
			}
			if tc.want == run.Error {
				if len(specs) != 0 {
					t.Errorf("a session was started for a refused class: %+v", specs)
				}
				if !strings.Contains(string(res.Log), tc.wantErr) {
					t.Errorf("the run log does not name the class:\n%s", res.Log)
				}
				return
			}
			if len(specs) != 1 {
				t.Fatalf("%d sessions started, want 1", len(specs))
			}
			if d := cmp.Diff([]any{specs[0].Class.Name, specs[0].Resources}, []any{tc.wantClass, tc.wantRes}); d != "" {
				t.Errorf("session's class and resources (-got +want):\n%s", d)
			}
			if specs[0].Class.EphemeralStorage == "" {
				t.Errorf("class %s has no ephemeral-storage bound", specs[0].Class.Name)
			}
			if !strings.Contains(string(res.Log), tc.wantLog) {
				t.Errorf("the run log lacks %q:\n%s", tc.wantLog, res.Log)
			}
		})
	}
}

// TestDryRunClass: a dry run of a workflow naming a class the runner
// lacks is refused naming it, as the run would be, not shown in a
// session of no class.
func TestDryRunClass(t *testing.T) {
	t.Parallel()
	eng := run.New(run.Config{DefaultImage: "busybox:stable", Classes: classSet(t, "large:cpu=8")})
	req := run.Request{RunID: "dry", Workflow: parse(t, "on: [push]\nclass: huge\nsteps:\n  - run: echo hi\n"), Trusted: true}
	_, err := eng.DryRun(req, executor.PodDirs())
	if want := "class huge is not one of this runner's classes: default, large"; err == nil || err.Error() != want {
		t.Errorf("dry run: %v, want %q", err, want)
	}
	req.Workflow = parse(t, "on: [push]\nclass: large\nsteps:\n  - run: echo hi\n")
	if _, err := eng.DryRun(req, executor.PodDirs()); err != nil {
		t.Errorf("dry run in class large: %v", err)
	}
	if c := eng.SessionSpec(req).Class; c.Name != "large" || c.CPU != "8" {
		t.Errorf("dry run's session class: %+v, want large", c)
	}
}

// TestLegClasses: each leg of a matrix whose class is templated by its
// values starts its session in its own class.
func TestLegClasses(t *testing.T) {
	t.Parallel()
	wf := parse(t, "on: [push]\nmatrix: {size: [small, large]}\nclass: ${{ matrix.size }}\nsteps:\n  - run: echo hello\n")
	var got []string
	for _, leg := range wf.Legs() {
		var specs []executor.Spec
		fake := &fakeexec.Executor{OnStart: func(s executor.Spec) { specs = append(specs, s) }}
		eng := run.New(run.Config{Executor: fake, DefaultImage: "busybox:stable", Classes: classSet(t, "large:cpu=8", "small:cpu=1")})
		res := eng.Run(context.Background(), run.Request{RunID: "leg", Workflow: leg, Checkout: t.TempDir(), Trusted: true})
		if res.Status != run.Success || len(specs) != 1 {
			t.Fatalf("leg %s: %s %q, %d sessions", leg.Name, res.Status, res.Error, len(specs))
		}
		got = append(got, leg.Name+": "+specs[0].Class.Name)
	}
	if d := cmp.Diff([]string{"limits (size=small): small", "limits (size=large): large"}, got); d != "" {
		t.Errorf("legs' sessions' classes (-want +got):\n%s", d)
	}
}
