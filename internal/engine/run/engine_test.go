package run_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/lib/tarstream"
	"knotless.dev/run/internal/rules/workflow"
)

// The engine on an in-memory executor: statuses, step results, the log,
// secrets, outputs and the handover, without a process or a container.

func twoSteps() *workflow.Workflow {
	return &workflow.Workflow{Name: "ci", Steps: []workflow.Step{{Name: "build", Run: "make"}, {Name: "test", Run: "make test"}}}
}

func checkout(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func statuses(res *run.Result) []string {
	var s []string
	for _, st := range res.Steps {
		s = append(s, st.Name+"="+string(st.Status))
	}
	return s
}

func TestEngineStatuses(t *testing.T) {
	t.Parallel()
	boom := errors.New("stream broke")
	for _, tc := range []struct {
		name       string
		exec       *fakeexec.Executor
		status     run.Status
		failedStep string
		steps      []string
		logHas     string
	}{
		{"success", &fakeexec.Executor{Script: func(_, id string) fakeexec.Step { return fakeexec.Step{Output: "step " + id + " ok\n"} }},
			run.Success, "", []string{"build=success", "test=success"}, "step 2 ok"},
		{"a step fails", &fakeexec.Executor{Script: func(_, id string) fakeexec.Step {
			if id == "1" {
				return fakeexec.Step{Output: "no rule", Code: 2}
			}
			return fakeexec.Step{}
		}}, run.Failure, "build", []string{"build=failure", "test=skipped"}, "<== step build: failure, exit 2"},
		{"following a step fails", &fakeexec.Executor{Script: func(string, string) fakeexec.Step { return fakeexec.Step{Err: boom} }},
			run.Error, "build", []string{"build=error", "test=skipped"}, "stream broke"},
		{"the session does not start", &fakeexec.Executor{StartErr: boom},
			run.Error, "", []string{"build=skipped", "test=skipped"}, "start session of workflow ci: stream broke"},
		{"the checkout is not taken", &fakeexec.Executor{PutErr: boom},
			run.Error, "", []string{"build=skipped", "test=skipped"}, "put checkout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eng := run.New(run.Config{Executor: tc.exec, DefaultImage: "alpine"})
			res := eng.Run(t.Context(), run.Request{RunID: "r1", Workflow: twoSteps(), Checkout: checkout(t, map[string]string{"a": "b"})})
			if res.Status != tc.status || res.FailedStep != tc.failedStep {
				t.Errorf("status %s, failed step %q; want %s, %q (error %q)", res.Status, res.FailedStep, tc.status, tc.failedStep, res.Error)
			}
			if diff := cmp.Diff(tc.steps, statuses(res)); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if !strings.Contains(string(res.Log), tc.logHas) {
				t.Errorf("log lacks %q:\n%s", tc.logHas, res.Log)
			}
			if res.Executor != fakeexec.Name || res.FinishedAt.Before(res.StartedAt) {
				t.Errorf("executor %q, started %s, finished %s", res.Executor, res.StartedAt, res.FinishedAt)
			}
			if s := tc.exec.Session("r1"); s != nil && !s.Stopped() {
				t.Error("session not stopped after the run")
			}
		})
	}
}

// Secrets: a trusted run gets the granted ones in the step's payload and
// never in clear in the log; an untrusted one is told they are withheld;
// a granted secret without a value is an error before any session.
func TestEngineSecrets(t *testing.T) {
	t.Parallel()
	wf := &workflow.Workflow{Name: "deploy", Secrets: []string{"TOKEN"},
		Steps: []workflow.Step{{Name: "push", Run: "deploy", Secrets: []string{"TOKEN"}}}}
	echo := func(string, string) fakeexec.Step { return fakeexec.Step{Output: "token is hunter2\n"} }

	t.Run("trusted", func(t *testing.T) {
		t.Parallel()
		ex := &fakeexec.Executor{Script: echo}
		res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: t.TempDir(),
			Trusted: true, Secrets: map[string]string{"TOKEN": "hunter2", "OTHER": "x"}})
		if res.Status != run.Success {
			t.Fatalf("status %s: %s", res.Status, res.Error)
		}
		if strings.Contains(string(res.Log), "hunter2") {
			t.Errorf("secret in clear in the log:\n%s", res.Log)
		}
		p, _ := ex.Session("r").Payload("1")
		if !strings.Contains(string(p), "hunter2") {
			t.Error("the step's payload lacks its granted secret")
		}
	})
	t.Run("untrusted", func(t *testing.T) {
		t.Parallel()
		ex := &fakeexec.Executor{}
		res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: t.TempDir(),
			Secrets: map[string]string{"TOKEN": "hunter2"}})
		if !strings.Contains(string(res.Log), "secret TOKEN withheld: untrusted run") {
			t.Errorf("log does not say the secret is withheld:\n%s", res.Log)
		}
		if p, _ := ex.Session("r").Payload("1"); strings.Contains(string(p), "hunter2") {
			t.Error("an untrusted run's payload holds the secret")
		}
	})
	t.Run("no value", func(t *testing.T) {
		t.Parallel()
		ex := &fakeexec.Executor{}
		res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: t.TempDir(), Trusted: true})
		if res.Status != run.Error || !strings.Contains(res.Error, "no value for it") {
			t.Errorf("status %s, error %q", res.Status, res.Error)
		}
		if ex.Session("r") != nil {
			t.Error("a session was started for a run that cannot have its secrets")
		}
	})
}

func TestEngineDryRunMasksSecrets(t *testing.T) {
	t.Parallel()
	eng := run.New(run.Config{Executor: &fakeexec.Executor{}, DefaultImage: "alpine:3", Runner: "did:plc:runner"})
	wf := &workflow.Workflow{Name: "deploy", Secrets: []string{"TOKEN"}, Env: []workflow.EnvVar{{Name: "MODE", Value: "fast"}},
		Steps: []workflow.Step{{Name: "push", Run: "deploy", Secrets: []string{"TOKEN"}}}}
	req := run.Request{RunID: "r", Workflow: wf, Trusted: true, Secrets: map[string]string{"TOKEN": "hunter2"}}
	payloads, err := eng.DryRun(req, executor.PodDirs())
	if err != nil {
		t.Fatal(err)
	}
	if len(payloads) != 1 || strings.Contains(payloads[0], "hunter2") || !strings.Contains(payloads[0], "MODE") {
		t.Errorf("payloads %q: want one, with MODE and without the secret's value", payloads)
	}
	if spec := eng.SessionSpec(req); spec.Image != "alpine:3" || spec.Runner != "did:plc:runner" || spec.RunID != "r" {
		t.Errorf("session spec %+v", spec)
	}
	if _, err := eng.DryRun(run.Request{RunID: "r", Workflow: wf, Trusted: true}, executor.PodDirs()); err == nil {
		t.Error("a dry run of a secret without a value did not fail")
	}
}

// The executor reads the run's trust from its spec; it never decides it.
func TestSessionSpecCarriesTrust(t *testing.T) {
	t.Parallel()
	eng := run.New(run.Config{Executor: &fakeexec.Executor{}, DefaultImage: "alpine:3"})
	wf := &workflow.Workflow{Name: "w", Steps: []workflow.Step{{Name: "s", Run: "true"}}}
	for _, trusted := range []bool{true, false} {
		if got := eng.SessionSpec(run.Request{RunID: "r", Workflow: wf, Trusted: trusted}).Trusted; got != trusted {
			t.Errorf("request trusted %v: spec trusted %v", trusted, got)
		}
	}
}

// A step that uses a shared step file runs that file's text; a missing
// one is an error before the session starts.
func TestEngineUsesSharedSteps(t *testing.T) {
	t.Parallel()
	wf := &workflow.Workflow{Name: "ci", Steps: []workflow.Step{{Name: "lint", Uses: "lint.sh"}}}
	ex := &fakeexec.Executor{}
	dir := checkout(t, map[string]string{workflow.StepsDir + "/lint.sh": "echo linting\n"})
	res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: dir})
	if res.Status != run.Success {
		t.Fatalf("status %s: %s", res.Status, res.Error)
	}
	res = run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r2", Workflow: wf, Checkout: t.TempDir()})
	if res.Status != run.Error || !strings.Contains(res.Error, "uses lint.sh") {
		t.Errorf("missing shared step: status %s, error %q", res.Status, res.Error)
	}
}

// Outputs come back into the request's directory and are listed; a
// bound they pass names its flag.
func TestEngineOutputs(t *testing.T) {
	t.Parallel()
	ex := &fakeexec.Executor{Outputs: map[string]string{"report.txt": "ok", "img/plot.png": "\x89PNG"}}
	out := filepath.Join(t.TempDir(), "outputs")
	res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: twoSteps(), Checkout: t.TempDir(), Outputs: out})
	if res.Status != run.Success {
		t.Fatalf("status %s: %s", res.Status, res.Error)
	}
	if diff := cmp.Diff([]string{"img/plot.png", "report.txt"}, res.Outputs); diff != "" {
		t.Errorf("outputs (-want +got):\n%s", diff)
	}
	if b, err := os.ReadFile(filepath.Join(out, "report.txt")); err != nil || string(b) != "ok" {
		t.Errorf("report.txt: %q, %v", b, err)
	}

	bound := run.Bound{Limits: tarstream.Limits{MaxFiles: 1}, FilesName: "--max-output-files"}
	res = run.New(run.Config{Executor: ex, Outputs: bound}).Run(t.Context(), run.Request{RunID: "r2", Workflow: twoSteps(), Checkout: t.TempDir(), Outputs: out + "2"})
	if res.Status != run.Error || !strings.Contains(res.Error, "--max-output-files") {
		t.Errorf("outputs over the bound: status %s, error %q", res.Status, res.Error)
	}
	cbound := run.Bound{Limits: tarstream.Limits{MaxBytes: 1}, BytesName: "--max-checkout-bytes"}
	res = run.New(run.Config{Executor: ex, Checkout: cbound}).Run(t.Context(), run.Request{RunID: "r3", Workflow: twoSteps(), Checkout: checkout(t, map[string]string{"big": "0123456789"})})
	if res.Status != run.Error || !strings.Contains(res.Error, "--max-checkout-bytes") {
		t.Errorf("checkout over the bound: status %s, error %q", res.Status, res.Error)
	}
}

// Every output reaches the outputs directory; only those the
// workflow's artifacts name are the run's Artifacts (none without
// artifacts), and the result's Mask masks what the log masks: a trusted
// run's granted values, nothing of an untrusted one.
func TestEngineArtifactsAndMask(t *testing.T) {
	t.Parallel()
	const secret = "tok-3e1f9a"
	ex := &fakeexec.Executor{Outputs: map[string]string{"report.txt": "token " + secret, "deploy.env": "TOKEN=" + secret, "site/a/index.html": "<p>"}}
	for _, tc := range []struct {
		name      string
		artifacts []string
		trusted   bool
		want      []string
		masked    string
	}{
		{"no artifacts", nil, true, nil, "token ***"},
		{"one file", []string{"report.txt"}, true, []string{"report.txt"}, "token ***"},
		{"a pattern", []string{"site/**", "*.txt"}, true, []string{"report.txt", "site/a/index.html"}, "token ***"},
		{"untrusted", []string{"report.txt"}, false, []string{"report.txt"}, "token " + secret},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wf := twoSteps()
			wf.Secrets, wf.Artifacts = []string{"TOKEN"}, tc.artifacts
			out := filepath.Join(t.TempDir(), "outputs")
			res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r-" + strings.ReplaceAll(tc.name, " ", "-"), Workflow: wf, Checkout: t.TempDir(), Outputs: out,
				Trusted: tc.trusted, Secrets: map[string]string{"TOKEN": secret}})
			if res.Status != run.Success {
				t.Fatalf("status %s: %s", res.Status, res.Error)
			}
			if diff := cmp.Diff([]string{"deploy.env", "report.txt", "site/a/index.html"}, res.Outputs); diff != "" {
				t.Errorf("outputs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, res.Artifacts); diff != "" {
				t.Errorf("artifacts (-want +got):\n%s", diff)
			}
			var b strings.Builder
			w := res.Mask.Writer(&b)
			_, _ = w.Write([]byte("token " + secret))
			_ = w.Flush()
			if b.String() != tc.masked {
				t.Errorf("through the result's Mask: %q, want %q", b.String(), tc.masked)
			}
		})
	}
}

// A step past its timeout is killed and fails as timed out; a cancelled
// run is Cancelled and its step killed.
func TestEngineTimeoutAndCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		never := make(chan struct{})
		ex := &fakeexec.Executor{Script: func(string, string) fakeexec.Step { return fakeexec.Step{Output: "waiting\n", Gate: never} }}
		wf := &workflow.Workflow{Name: "ci", Steps: []workflow.Step{{Name: "slow", Run: "sleep", Timeout: time.Minute}}}
		res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: t.TempDir()})
		if res.Status != run.Failure || !res.Steps[0].TimedOut || !strings.Contains(res.Error, "timed out after 1m0s") {
			t.Errorf("timed out step: status %s, step %+v, error %q", res.Status, res.Steps[0], res.Error)
		}
		if got := ex.Session("r").Killed(); !cmp.Equal(got, []string{"1"}) {
			t.Errorf("killed %q, want the step", got)
		}

		wf = &workflow.Workflow{Name: "ci", Timeout: time.Hour, Steps: []workflow.Step{{Name: "slow", Run: "sleep"}}}
		res = run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r2", Workflow: wf, Checkout: t.TempDir()})
		if res.Status != run.Failure || !res.Steps[0].TimedOut || !strings.Contains(res.Error, "timed out after 1h0m0s") {
			t.Errorf("run past the workflow's timeout: status %s, error %q", res.Status, res.Error)
		}

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan *run.Result)
		go func() {
			done <- run.New(run.Config{Executor: ex}).Run(ctx, run.Request{RunID: "r3", Workflow: twoSteps(), Checkout: t.TempDir()})
		}()
		synctest.Wait()
		cancel()
		res = <-done
		if res.Status != run.Cancelled || res.FailedStep != "build" {
			t.Errorf("cancelled run: status %s, failed step %q", res.Status, res.FailedStep)
		}
	})
}

// Detached at the first step and adopted by a second engine: the log
// goes on from the offset, the remaining step runs, and the session is
// stopped only at the end.
func TestEngineDetachAndAdopt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		ex := &fakeexec.Executor{Script: func(_, id string) fakeexec.Step {
			if id == "1" {
				return fakeexec.Step{Output: "first half\nsecond half\n", Gate: gate}
			}
			return fakeexec.Step{Output: "step " + id + "\n"}
		}}
		detach := make(chan struct{})
		req := run.Request{RunID: "r", Workflow: twoSteps(), Checkout: t.TempDir(), Detach: detach}
		done := make(chan *run.Result)
		go func() { done <- run.New(run.Config{Executor: ex}).Run(t.Context(), req) }()
		synctest.Wait()
		close(detach)
		res := <-done
		if res.Status != run.Detached || res.Handover == nil || !res.Handover.Started || res.Handover.Step != 0 {
			t.Fatalf("detached run: status %s, handover %+v", res.Status, res.Handover)
		}
		if ex.Session("r").Stopped() {
			t.Fatal("a detached run's session was stopped")
		}

		close(gate)
		req.Detach = nil
		adopted := run.New(run.Config{Executor: ex}).Adopt(t.Context(), req, *res.Handover, res.Log)
		if adopted.Status != run.Success {
			t.Fatalf("adopted run: status %s: %s\n%s", adopted.Status, adopted.Error, adopted.Log)
		}
		log := string(adopted.Log)
		if strings.Count(log, "second half") != 1 || !strings.Contains(log, "adopted by a new runner process") || !strings.Contains(log, "step 2") {
			t.Errorf("adopted log:\n%s", log)
		}
		if !ex.Session("r").Stopped() {
			t.Error("the adopted run's session was not stopped")
		}

		bad := *res.Handover
		bad.Step = 5
		if r := run.New(run.Config{Executor: ex}).Adopt(t.Context(), req, bad, nil); r.Status != run.Error {
			t.Errorf("adopting at a step past the workflow: %s", r.Status)
		}
	})
}

// Detached before a step starts: the successor starts it.
func TestEngineDetachBetweenSteps(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		detach := make(chan struct{})
		ex := &fakeexec.Executor{Script: func(_, id string) fakeexec.Step {
			if id == "1" {
				close(detach) // the run is detached while step 1 ends
			}
			return fakeexec.Step{}
		}}
		req := run.Request{RunID: "r", Workflow: twoSteps(), Checkout: t.TempDir(), Detach: detach}
		res := run.New(run.Config{Executor: ex}).Run(t.Context(), req)
		if res.Status != run.Detached || res.Handover.Started || res.Handover.Step != 1 {
			t.Fatalf("status %s, handover %+v", res.Status, res.Handover)
		}
		req.Detach = nil
		adopted := run.New(run.Config{Executor: ex}).Adopt(t.Context(), req, *res.Handover, res.Log)
		if diff := cmp.Diff([]string{"build=success", "test=success"}, statuses(adopted)); adopted.Status != run.Success || diff != "" {
			t.Errorf("adopted: status %s, steps (-want +got):\n%s", adopted.Status, diff)
		}
	})
}

// An executor that cannot resume sessions cannot adopt, and never
// detaches.
func TestEngineAdoptNeedsAResumer(t *testing.T) {
	t.Parallel()
	ex := plainExecutor{&fakeexec.Executor{}}
	res := run.New(run.Config{Executor: ex}).Adopt(t.Context(), run.Request{RunID: "r", Workflow: twoSteps()}, run.Handover{}, []byte("before\n"))
	if res.Status != run.Error || !strings.Contains(res.Error, "cannot resume sessions") || !strings.HasPrefix(string(res.Log), "before\n") {
		t.Errorf("status %s, error %q, log %q", res.Status, res.Error, res.Log)
	}
	detach := make(chan struct{})
	close(detach)
	res = run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r2", Workflow: twoSteps(), Checkout: t.TempDir(), Detach: detach})
	if res.Status != run.Success {
		t.Errorf("a run on an executor without Resume was detached: %s", res.Status)
	}
}

// plainExecutor hides the fake's Resume.
type plainExecutor struct{ e *fakeexec.Executor }

func (p plainExecutor) Name() string { return "plain" }
func (p plainExecutor) Start(ctx context.Context, s executor.Spec) (executor.Session, error) {
	return p.e.Start(ctx, s)
}
func (p plainExecutor) Sweep(ctx context.Context, keep []string) ([]executor.Ref, error) {
	return p.e.Sweep(ctx, keep)
}

func TestValidImageGlob(t *testing.T) {
	t.Parallel()
	if err := run.ValidImageGlob("registry.local/*"); err != nil {
		t.Error(err)
	}
	if err := run.ValidImageGlob("[a-"); err == nil {
		t.Error("a malformed glob was accepted")
	}
}

// Run variables (a re-run's env, a dispatch's inputs) reach every step's
// payload after the workflow's env, are not masked, and a refused one
// ends the run error, naming it, before any session starts.
func TestEngineRunVars(t *testing.T) {
	t.Parallel()
	wf := &workflow.Workflow{Name: "ci", Secrets: []string{"TOKEN"}, Env: []workflow.EnvVar{{Name: "MODE", Value: "fast"}, {Name: "KEEP", Value: "k"}},
		Steps: []workflow.Step{{Name: "a", Run: "x"}, {Name: "b", Run: "y"}}}
	vars := []workflow.EnvVar{{Name: "MODE", Value: "slow"}, {Name: "DEBUG", Value: "it's 1"}}

	t.Run("every step gets them", func(t *testing.T) {
		t.Parallel()
		ex := &fakeexec.Executor{Script: func(string, string) fakeexec.Step { return fakeexec.Step{Output: "DEBUG=it's 1\n"} }}
		res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: t.TempDir(), Vars: vars})
		if res.Status != run.Success {
			t.Fatalf("status %s: %s", res.Status, res.Error)
		}
		for _, step := range []string{"1", "2"} {
			p, _ := ex.Session("r").Payload(step)
			for _, want := range []string{"export DEBUG='it'\\''s 1'\n", "export MODE='slow'\n", "export KEEP='k'\n"} {
				if !strings.Contains(string(p), want) {
					t.Errorf("step %s's payload lacks %q:\n%s", step, want, p)
				}
			}
			if strings.Contains(string(p), "fast") {
				t.Errorf("step %s's payload keeps the workflow's MODE beside the run's:\n%s", step, p)
			}
		}
		if !strings.Contains(string(res.Log), "DEBUG=it's 1") {
			t.Errorf("a run variable is masked in the log:\n%s", res.Log)
		}
	})
	for _, tc := range []struct {
		name    string
		vars    []workflow.EnvVar
		trusted bool
		want    string
	}{
		{"a reserved name", []workflow.EnvVar{{Name: "KNOTLESS_RUN_WORK", Value: "/"}}, true, `run variable "KNOTLESS_RUN_WORK": KNOTLESS_ is reserved for the runner's variables`},
		{"a granted secret's name", []workflow.EnvVar{{Name: "TOKEN", Value: "mine"}}, true, `run variable "TOKEN": the workflow grants a secret of that name`},
		{"a granted secret's name, untrusted", []workflow.EnvVar{{Name: "TOKEN", Value: "mine"}}, false, `run variable "TOKEN": the workflow grants a secret of that name`},
		{"not a shell name", []workflow.EnvVar{{Name: "A B", Value: "x"}}, false, `run variable "A B": not a shell variable name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ex := &fakeexec.Executor{}
			res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: t.TempDir(),
				Trusted: tc.trusted, Secrets: map[string]string{"TOKEN": "hunter2"}, Vars: tc.vars})
			if res.Status != run.Error || !strings.Contains(res.Error, tc.want) {
				t.Errorf("status %s, error %q; want error with %q", res.Status, res.Error, tc.want)
			}
			if ex.Session("r") != nil {
				t.Error("a session was started for a run with a refused variable")
			}
		})
	}
	t.Run("dry run", func(t *testing.T) {
		t.Parallel()
		eng := run.New(run.Config{Executor: &fakeexec.Executor{}})
		payloads, err := eng.DryRun(run.Request{RunID: "r", Workflow: wf, Vars: vars}, executor.PodDirs())
		if err != nil || len(payloads) != 2 || !strings.Contains(payloads[1], "export DEBUG=") {
			t.Errorf("payloads %q, %v: want two, with DEBUG", payloads, err)
		}
		if _, err := eng.DryRun(run.Request{RunID: "r", Workflow: wf, Vars: []workflow.EnvVar{{Name: "TOKEN"}}}, executor.PodDirs()); err == nil {
			t.Error("a dry run with a refused variable did not fail")
		}
	})
}

// TestStepErrorCarriesTheTail: a step that fails, by its exit code or
// its timeout, ends the run with a StepError naming the step, its exit
// code or timeout and the last lines of its output, masked and without
// the runner's own lines; a run whose steps pass has none.
func TestStepErrorCarriesTheTail(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	for i := 1; i <= 14; i++ {
		fmt.Fprintf(&out, "line %d\n", i)
	}
	out.WriteString("token hunter2\nno rule to make target\n")
	wf := &workflow.Workflow{Name: "ci", Secrets: []string{"TOKEN"},
		Steps: []workflow.Step{{Name: "build", Run: "make", Secrets: []string{"TOKEN"}}, {Name: "test", Run: "make test"}}}
	ex := &fakeexec.Executor{Script: func(_, id string) fakeexec.Step {
		if id == "1" {
			return fakeexec.Step{Output: out.String(), Code: 2}
		}
		return fakeexec.Step{}
	}}
	res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: t.TempDir(),
		Trusted: true, Secrets: map[string]string{"TOKEN": "hunter2"}})
	code := 2
	want := &run.StepError{Step: "build", ExitCode: &code,
		Tail: "line 7\nline 8\nline 9\nline 10\nline 11\nline 12\nline 13\nline 14\ntoken ***\nno rule to make target"}
	if diff := cmp.Diff(want, res.StepError); diff != "" {
		t.Errorf("step error (-want +got):\n%s", diff)
	}
	if res.Error != want.Error() {
		t.Errorf("error %q, want the step error's text %q", res.Error, want.Error())
	}

	ok := run.New(run.Config{Executor: &fakeexec.Executor{}}).Run(t.Context(), run.Request{RunID: "r", Workflow: twoSteps(), Checkout: t.TempDir()})
	if ok.Status != run.Success || ok.StepError != nil {
		t.Errorf("a passing run: status %s, step error %+v", ok.Status, ok.StepError)
	}

	synctest.Test(t, func(t *testing.T) {
		never := make(chan struct{})
		ex := &fakeexec.Executor{Script: func(string, string) fakeexec.Step {
			return fakeexec.Step{Output: "waiting\nstill waiting", Gate: never}
		}}
		wf := &workflow.Workflow{Name: "ci", Steps: []workflow.Step{{Name: "slow", Run: "sleep", Timeout: time.Minute}}}
		res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r", Workflow: wf, Checkout: t.TempDir()})
		want := &run.StepError{Step: "slow", TimedOut: true, Timeout: time.Minute, Tail: "waiting\nstill waiting"}
		if diff := cmp.Diff(want, res.StepError); diff != "" {
			t.Errorf("timed-out step's error (-want +got):\n%s", diff)
		}
	})
}
