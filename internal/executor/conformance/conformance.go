// Package conformance is the one behaviour table that every executor must
// pass: status rules, timeouts, secrets, leftover processes and hostile
// transfers, and a case for each optional capability (resume, release,
// health, gone) that runs when the executor has it. Each executor's tests call Run with a way to build it; a
// behaviour only one executor passes is a bug in that executor.
package conformance

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/tarstream"
	"knotless.dev/run/internal/rules/workflow"
)

// Harness tells the table how to use one executor.
type Harness struct {
	// New returns a fresh executor for one test.
	New func(t *testing.T) executor.Executor
	// Image is the image steps run in (pod executors); it has a POSIX
	// sh and busybox-like tools.
	Image string
	// SecretSearch lists, as sh words, the places a step greps for a
	// leaked secret value: the session's whole writable file system.
	SecretSearch string
	// CachePath is the cache path the caches case names in its
	// workflow: "/cache" when empty. The shell executor's session is a
	// directory of the host, so it names one relative to the work
	// directory.
	CachePath string
	// StartTime bounds how long Start takes on this executor's test
	// setup, under load (a container or pod to create and start). A run
	// timeout covers the session's start: a case whose run timeout must
	// end while its step runs gets this much longer. Zero for an executor
	// that starts at once.
	StartTime time.Duration
	// Fenced: the executor names a session's objects from its run id,
	// so a second Start of one run fails with executor.ErrRunExists
	// while the first session lives (the pod executors). The shell
	// executor's sessions are directories of a fresh name each.
	Fenced bool
	// Services: the executor runs a workflow's services (its sessions
	// are executor.ServiceRunners); any other refuses a workflow with
	// services.
	Services bool
	// StepImages: the executor runs a step that names an image in a
	// container of that image beside the run's; any other refuses a
	// workflow with such a step.
	StepImages bool
}

// Run runs the whole table against h.
func Run(t *testing.T, h Harness) {
	t.Run("status", func(t *testing.T) { t.Parallel(); testStatus(t, h) })
	t.Run("secrets", func(t *testing.T) { t.Parallel(); testSecrets(t, h) })
	t.Run("run variables", func(t *testing.T) { t.Parallel(); testRunVars(t, h) })
	t.Run("transfers", func(t *testing.T) { t.Parallel(); testTransfers(t, h) })
	t.Run("hostile outputs", func(t *testing.T) { t.Parallel(); testHostileOutputs(t, h) })
	t.Run("session steps", func(t *testing.T) { t.Parallel(); testSessionSteps(t, h) })
	t.Run("one transfer at the root", func(t *testing.T) { t.Parallel(); testRootTransfer(t, h) })
	t.Run("bounds", func(t *testing.T) { t.Parallel(); testBounds(t, h) })
	t.Run("caches", func(t *testing.T) { t.Parallel(); testCaches(t, h) })
	t.Run("cache taint", func(t *testing.T) { t.Parallel(); testCacheTaint(t, h) })
	t.Run("services", func(t *testing.T) { t.Parallel(); testServices(t, h) })
	t.Run("step images", func(t *testing.T) { t.Parallel(); testStepImages(t, h) })
	runCapabilities(t, h)
}

func engine(t *testing.T, h Harness) *run.Engine {
	return run.New(run.Config{Executor: h.New(t), DefaultImage: h.Image, Runner: "did:plc:conformance", CleanupTimeout: time.Minute})
}

func parse(t *testing.T, src string) *workflow.Workflow {
	t.Helper()
	wf, err := workflow.Parse("conformance.yaml", []byte(src))
	if err != nil {
		t.Fatalf("test workflow: %v", err)
	}
	return wf
}

func runID(t *testing.T) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

func intp(i int) *int { return &i }

func testStatus(t *testing.T, h Harness) {
	tests := []struct {
		name       string
		src        string
		checkout   string // "" = an empty temporary directory
		cancelOn   string // cancel the run when its log shows this
		wantStatus run.Status
		wantFailed string
		wantSteps  []run.StepResult  // Name, Status, ExitCode, TimedOut compared
		wantError  string            // substring
		files      map[string]string // put in the checkout
		event      workflow.CondEvent
		trusted    *bool    // default true
		wantLog    []string // substrings of the log
		notLog     []string // not in the log
		leg        int      // of a matrix: which leg runs
	}{
		{
			name:       "success",
			src:        "on: push\nsteps:\n  - {name: a, run: 'echo one'}\n  - {name: b, run: 'echo two'}\n",
			wantStatus: run.Success,
			wantSteps:  []run.StepResult{{Name: "a", Status: run.Success, ExitCode: intp(0)}, {Name: "b", Status: run.Success, ExitCode: intp(0)}},
		},
		{
			name:       "failing step names step and exit code",
			src:        "on: push\nsteps:\n  - {name: ok, run: 'true'}\n  - {name: bad, run: 'echo failing; exit 3'}\n  - {name: never, run: 'true'}\n",
			wantStatus: run.Failure, wantFailed: "bad", wantError: `step "bad" exited with code 3`,
			wantSteps: []run.StepResult{{Name: "ok", Status: run.Success, ExitCode: intp(0)}, {Name: "bad", Status: run.Failure, ExitCode: intp(3)}, {Name: "never", Status: run.Skipped}},
		},
		{
			name:       "set -e stops a script at its first failing command",
			src:        "on: push\nsteps:\n  - {name: e, run: \"false\\necho unreachable\"}\n",
			wantStatus: run.Failure, wantFailed: "e",
			wantSteps: []run.StepResult{{Name: "e", Status: run.Failure, ExitCode: intp(1)}},
		},
		{
			name:       "hanging step is killed at its timeout",
			src:        "on: push\nsteps:\n  - {name: hang, timeout: 2s, run: 'sleep 300 & sleep 300'}\n",
			wantStatus: run.Failure, wantFailed: "hang", wantError: `step "hang" timed out after 2s`,
			wantSteps: []run.StepResult{{Name: "hang", Status: run.Failure, TimedOut: true}},
		},
		{
			name:       "run timeout",
			src:        "on: push\ntimeout: {{runTimeout}}\nsteps:\n  - {name: slow, run: 'sleep 300'}\n",
			wantStatus: run.Failure, wantFailed: "slow", wantError: `step "slow" timed out after {{runTimeout}}`,
			wantSteps: []run.StepResult{{Name: "slow", Status: run.Failure, TimedOut: true}},
		},
		{
			name:       "missing checkout is an error",
			src:        "on: push\nsteps:\n  - {name: a, run: 'true'}\n",
			checkout:   "/nonexistent/knotless-checkout",
			wantStatus: run.Error, wantError: "checkout /nonexistent/knotless-checkout",
			wantSteps: []run.StepResult{{Name: "a", Status: run.Skipped}},
		},
		{
			name:       "cancel",
			src:        "on: push\nsteps:\n  - {name: long, run: 'echo running; sleep 300'}\n",
			cancelOn:   "running\n",
			wantStatus: run.Cancelled, wantFailed: "long",
			wantSteps: []run.StepResult{{Name: "long", Status: run.Cancelled}},
		},
		{
			name: "if: failure() and always() run after a failure, a step without if (or without a step function in it) does not",
			src: `on: push
steps:
  - {name: ok, run: 'true'}
  - {name: bad, run: 'exit 3'}
  - {name: never, run: 'echo never-ran'}
  - {name: on-success, if: success(), run: 'echo never-ran'}
  - {name: on-failure, if: failure(), run: 'echo cleaning-after-failure'}
  - {name: implicit, if: "event.trusted || !event.trusted", run: 'echo never-ran'}
  - {name: last, if: always(), run: 'echo always-ran; exit 4'}
`,
			wantStatus: run.Failure, wantFailed: "bad", wantError: `step "bad" exited with code 3`,
			wantSteps: []run.StepResult{
				{Name: "ok", Status: run.Success, ExitCode: intp(0)}, {Name: "bad", Status: run.Failure, ExitCode: intp(3)},
				{Name: "never", Status: run.Skipped}, {Name: "on-success", Status: run.Skipped},
				{Name: "on-failure", Status: run.Success, ExitCode: intp(0)}, {Name: "implicit", Status: run.Skipped},
				{Name: "last", Status: run.Failure, ExitCode: intp(4)},
			},
			wantLog: []string{"cleaning-after-failure\n", "always-ran\n", "==> step 3/7: never: skipped (an earlier step failed)",
				"==> step 4/7: on-success: skipped (if: success())", "==> step 6/7: implicit: skipped (an earlier step failed)"},
			notLog: []string{"never-ran"},
		},
		{
			name: "continue-on-error records the failure and the run goes on",
			src: `on: push
steps:
  - {name: may, run: 'exit 5', continue-on-error: true}
  - {name: next, run: 'echo next-ran'}
  - {name: on-failure, if: failure(), run: 'echo never-ran'}
  - {name: timed, run: 'sleep 300', timeout: 1s, continue-on-error: true}
`,
			wantStatus: run.Success,
			wantSteps: []run.StepResult{
				{Name: "may", Status: run.Failure, ExitCode: intp(5)}, {Name: "next", Status: run.Success, ExitCode: intp(0)},
				{Name: "on-failure", Status: run.Skipped}, {Name: "timed", Status: run.Failure, TimedOut: true},
			},
			wantLog: []string{"next-ran\n", `knotless-run: step may failed, and may (continue-on-error): step "may" exited with code 5`},
			notLog:  []string{"never-ran"},
		},
		{
			name: "conditions read the event",
			src: `on: pull
steps:
  - {name: pull, if: "event.kind == 'pull' && event.base == 'main' && event.branch == 'main' && !event.trusted", run: 'echo pull-ran'}
  - {name: push, if: "event.kind == 'push' || event.trusted", run: 'echo never-ran'}
`,
			event:      workflow.CondEvent{Kind: "pull", Ref: "refs/heads/main", Base: "main"},
			trusted:    new(false),
			wantStatus: run.Success,
			wantSteps:  []run.StepResult{{Name: "pull", Status: run.Success, ExitCode: intp(0)}, {Name: "push", Status: run.Skipped}},
			wantLog:    []string{"pull-ran\n"},
			notLog:     []string{"never-ran"},
		},
		{
			name: "working-directory starts a step in a directory of the checkout",
			src: `on: push
steps:
  - {name: sub, working-directory: sub/dir, run: 'cat marker; touch made-here'}
  - {name: top, run: 'test -f sub/dir/made-here && test -f sub/dir/marker && echo top-sees-it'}
`,
			files:      map[string]string{"sub/dir/marker": "marker-in-sub-dir\n"},
			wantStatus: run.Success,
			wantSteps:  []run.StepResult{{Name: "sub", Status: run.Success, ExitCode: intp(0)}, {Name: "top", Status: run.Success, ExitCode: intp(0)}},
			wantLog:    []string{"marker-in-sub-dir\n", "top-sees-it\n"},
		},
		{
			name: "after a cancel, if: always() and cancelled() steps run",
			src: `on: push
steps:
  - {name: long, run: 'echo running; sleep 300'}
  - {name: plain, run: 'echo never-ran'}
  - {name: on-failure, if: failure(), run: 'echo never-ran'}
  - {name: on-cancel, if: cancelled(), run: 'echo cleaned-after-cancel'}
  - {name: last, if: always(), run: 'echo always-ran'}
`,
			cancelOn:   "running\n",
			wantStatus: run.Cancelled, wantFailed: "long",
			wantSteps: []run.StepResult{
				{Name: "long", Status: run.Cancelled}, {Name: "plain", Status: run.Skipped}, {Name: "on-failure", Status: run.Skipped},
				{Name: "on-cancel", Status: run.Success, ExitCode: intp(0)}, {Name: "last", Status: run.Success, ExitCode: intp(0)},
			},
			wantLog: []string{"cleaned-after-cancel\n", "always-ran\n", "==> step 2/5: plain: skipped (the run was cancelled)"},
			notLog:  []string{"never-ran"},
		},
		{
			name: "a matrix leg's values reach its steps, env, image and conditions",
			src: `on: push
image: "${{ matrix.img }}"
env:
  GREETING: "go-${{ matrix.go }}-on-${{matrix.os}}"
matrix:
  go: ["1.22", "1.23"]
  os: [linux]
  img: ["{{image}}"]
steps:
  - {name: vars, run: 'printf "leg go=%s os=%s greeting=%s workflow=%s\n" "$go" "$os" "$GREETING" "$KNOTLESS_RUN_WORKFLOW"'}
  - {name: only-1.23, if: "matrix.go == '1.23'", run: 'echo never-ran'}
  - {name: only-1.22, if: "matrix.go == '1.22' && matrix.os == 'linux'", run: 'echo ran-for-1.22'}
`,
			leg:        0,
			wantStatus: run.Success,
			wantSteps: []run.StepResult{
				{Name: "vars", Status: run.Success, ExitCode: intp(0)}, {Name: "only-1.23", Status: run.Skipped},
				{Name: "only-1.22", Status: run.Success, ExitCode: intp(0)},
			},
			wantLog: []string{"leg go=1.22 os=linux greeting=go-1.22-on-linux workflow=conformance (go=1.22, os=linux, img=", "ran-for-1.22\n",
				"==> step 2/3: only-1.23: skipped (if: matrix.go == '1.23')"},
			notLog: []string{"never-ran"},
		},
		{
			name: "a step's outputs reach the later steps' if and env",
			src: `on: push
steps:
  - {name: make, run: 'printf "version=1.2.3\\nflag=yes\\nbad line\\n" > "$KNOTLESS_RUN_STEP_OUTPUT"'}
  - {name: plain, run: 'echo no-outputs'}
  - name: use
    if: steps.make.outputs.flag == "yes" && !has(steps.plain.outputs.x)
    env: {VERSION: "v${{ steps.make.outputs.version }}", NONE: "[${{ steps.plain.outputs.x }}]"}
    run: 'echo "got $VERSION $NONE"'
  - {name: never, if: 'steps.make.outputs.flag == "no"', run: 'echo never-ran'}
`,
			wantStatus: run.Success,
			wantSteps: []run.StepResult{
				{Name: "make", Status: run.Success, ExitCode: intp(0)}, {Name: "plain", Status: run.Success, ExitCode: intp(0)},
				{Name: "use", Status: run.Success, ExitCode: intp(0)}, {Name: "never", Status: run.Skipped},
			},
			wantLog: []string{"got v1.2.3 []\n", "knotless-run: the outputs of step make: line 3: not key=value with a key of letters, digits, _ and - (left out)"},
			notLog:  []string{"never-ran"},
		},
		{
			name:       "uses a missing shared step",
			src:        "on: push\nsteps:\n  - {uses: nothing-here}\n",
			wantStatus: run.Error, wantError: "step nothing-here uses nothing-here",
			wantSteps: []run.StepResult{{Name: "nothing-here", Status: run.Skipped}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkout := tt.checkout
			if checkout == "" {
				checkout = t.TempDir()
			}
			for name, content := range tt.files {
				mustWrite(t, filepath.Join(checkout, name), content, 0o644)
			}
			// The run timeout starts before the session does.
			runTimeout := (3*time.Second + h.StartTime).String()
			src := strings.ReplaceAll(tt.src, "{{runTimeout}}", runTimeout)
			image := h.Image
			if image == "" {
				image = "busybox:stable" // the shell executor runs none
			}
			src = strings.ReplaceAll(src, "{{image}}", image)
			wantError := strings.ReplaceAll(tt.wantError, "{{runTimeout}}", runTimeout)
			ctx := context.Background()
			var live *cancelWriter
			if tt.cancelOn != "" {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
				// Cancel while the step runs, however long the session
				// took to start.
				live = &cancelWriter{on: tt.cancelOn, cancel: cancel}
			}
			trusted := tt.trusted == nil || *tt.trusted
			req := run.Request{RunID: runID(t), Workflow: parse(t, src).Legs()[tt.leg], Checkout: checkout, Trusted: trusted, Event: tt.event}
			if live != nil {
				req.Live = live
			}
			res := engine(t, h).Run(ctx, req)
			if live != nil && !live.fired() {
				t.Errorf("the run ended before its step printed %q", tt.cancelOn)
			}
			if res.Status != tt.wantStatus || res.FailedStep != tt.wantFailed || !strings.Contains(res.Error, wantError) {
				t.Errorf("result = %s, failed step %q, error %q; want %s, %q, error containing %q\nlog:\n%s",
					res.Status, res.FailedStep, res.Error, tt.wantStatus, tt.wantFailed, wantError, res.Log)
			}
			for _, want := range tt.wantLog {
				if !strings.Contains(string(res.Log), want) {
					t.Errorf("log lacks %q:\n%s", want, res.Log)
				}
			}
			for _, not := range tt.notLog {
				if strings.Contains(string(res.Log), not) {
					t.Errorf("log shows %q:\n%s", not, res.Log)
				}
			}
			if len(res.Steps) != len(tt.wantSteps) {
				t.Fatalf("%d step results, want %d", len(res.Steps), len(tt.wantSteps))
			}
			for i, want := range tt.wantSteps {
				got := res.Steps[i]
				if got.Name != want.Name || got.Status != want.Status || got.TimedOut != want.TimedOut || fmtCode(got.ExitCode) != fmtCode(want.ExitCode) {
					t.Errorf("step %d = %s %s exit %s timedOut %v; want %s %s exit %s timedOut %v",
						i, got.Name, got.Status, fmtCode(got.ExitCode), got.TimedOut, want.Name, want.Status, fmtCode(want.ExitCode), want.TimedOut)
				}
			}
		})
	}
}

func fmtCode(c *int) string {
	if c == nil {
		return "none"
	}
	return string(rune('0' + *c))
}

// hostileSecret exercises every quoting hazard of sh. Masking replaces
// the exact bytes of a value: output that transforms it (dash's echo
// turns \n into a newline) is not the value, so steps print it with
// printf %s.
const hostileSecret = "it's \"quoted\" $HOME ${PATH} `id` $(id)\nsecond line\\n \\ end '"

func testSecrets(t *testing.T, h Harness) {
	probe := "probe-" + runID(t) + "-value"
	sum := sha256.Sum256([]byte(hostileSecret))
	src := `on: push
secrets: [TOKEN, PROBE, UNUSED]
steps:
  - name: use
    secrets: [TOKEN, PROBE]
    run: |
      printf %s "$TOKEN" | sha256sum
      printf 'token=%s\n' "$TOKEN"
      printf 'probe=%s\n' "$PROBE"
      # No process may carry the value in its argv.
      for f in /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null | tr '\0' ' '; echo; done > "$TMPDIR_ARGV"
      if printf %s "$PROBE" | grep -qF -f - "$TMPDIR_ARGV"; then echo "PROBE IN ARGV"; fi
      rm -f "$TMPDIR_ARGV"
      # A background process left behind by a secret-bearing step.
      sh -c 'sleep 300; :' knotless-leftover-marker &
  - name: ungranted
    run: |
      test -z "${TOKEN:-}" && test -z "${PROBE:-}" && echo "no secrets here"
  - name: search
    secrets: [PROBE]
    run: |
      # The bracket keeps this grep from matching its own argv.
      if grep -l 'knotless-leftover-marke[r]' /proc/[0-9]*/cmdline 2>/dev/null | grep -q .; then echo "LEFTOVER PROCESS"; fi
      if printf %s "$PROBE" | grep -rlsF -f - ` + h.SecretSearch + `; then echo "PROBE IN A FILE"; fi
      echo "search done"
`
	src = strings.ReplaceAll(src, "$TMPDIR_ARGV", "/tmp/knotless-argv.$$")
	var live bytes.Buffer
	res := engine(t, h).Run(context.Background(), run.Request{
		RunID: runID(t), Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
		Secrets: map[string]string{"TOKEN": hostileSecret, "PROBE": probe, "UNUSED": "never-granted-to-a-step"},
		Live:    &live,
	})
	log := string(res.Log)
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, log)
	}
	for _, want := range []string{hex.EncodeToString(sum[:]), "token=***", "probe=***", "no secrets here", "search done"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	for _, leak := range []string{"second line", probe, "PROBE IN ARGV", "PROBE IN A FILE", "LEFTOVER PROCESS"} {
		if strings.Contains(log, leak) {
			t.Errorf("log contains %q:\n%s", leak, log)
		}
	}
	if live.String() != log {
		t.Errorf("live output differs from the run log")
	}

	// An untrusted run gets no secret, and the log names what was withheld.
	res = engine(t, h).Run(context.Background(), run.Request{
		RunID: runID(t), Workflow: parse(t, "on: pull\nsecrets: [TOKEN]\nsteps:\n  - {name: s, secrets: [TOKEN], run: 'test -z \"${TOKEN:-}\" && echo empty'}\n"),
		Checkout: t.TempDir(), Trusted: false, Secrets: map[string]string{"TOKEN": probe},
	})
	if res.Status != run.Success || !strings.Contains(string(res.Log), "secret TOKEN withheld: untrusted run") || !strings.Contains(string(res.Log), "empty") {
		t.Errorf("untrusted run: %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
}

// testRunVars: a run variable (a re-run's env, a dispatch's input)
// reaches every step, over the workflow's env of the same name, and is
// not masked; like a secret it travels only on the payload: it is in no
// process's argv, in the environment of no process but the step's own
// (where a container's or pod's spec env would be), in no file of the
// session, and not in the session's spec.
func testRunVars(t *testing.T, h Harness) {
	probe := "var-" + runID(t) + "-value"
	src := `on: push
env: {MODE: from-file}
steps:
  - name: first
    run: |
      printf 'first=%s\n' "$PROBE_VAR"
  - name: second
    run: |
      printf 'second=%s mode=%s\n' "$PROBE_VAR" "$MODE"
      for f in /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null | tr '\0' ' '; echo; done > /tmp/knotless-argv.$$
      if printf %s "$PROBE_VAR" | grep -qF -f - /tmp/knotless-argv.$$; then echo "VAR IN ARGV"; fi
      rm -f /tmp/knotless-argv.$$
      # Every process that is not the step's: a spec's env is theirs.
      others=0
      for f in /proc/[0-9]*/environ; do
        cat "$f" 2>/dev/null | tr '\0' '\n' > /tmp/knotless-env.$$
        test -s /tmp/knotless-env.$$ || continue
        if grep -q '^KNOTLESS_RUN_STEP=' /tmp/knotless-env.$$; then continue; fi
        others=$((others + 1))
        if printf %s "$PROBE_VAR" | grep -qF -f - /tmp/knotless-env.$$; then echo "VAR IN ANOTHER ENVIRONMENT"; fi
      done
      rm -f /tmp/knotless-env.$$
      echo "environments of other processes read: $others"
      if printf %s "$PROBE_VAR" | grep -rlsF -f - ` + h.SecretSearch + `; then echo "VAR IN A FILE"; fi
      echo "search done"
`
	eng := engine(t, h)
	req := run.Request{
		RunID: runID(t), Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true,
		Vars: []workflow.EnvVar{{Name: "PROBE_VAR", Value: probe}, {Name: "MODE", Value: "from-run"}},
	}
	if spec := fmt.Sprintf("%+v", eng.SessionSpec(req)); strings.Contains(spec, probe) {
		t.Errorf("the session's spec holds the run variable: %s", spec)
	}
	res := eng.Run(context.Background(), req)
	log := string(res.Log)
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, log)
	}
	for _, want := range []string{"first=" + probe + "\n", "second=" + probe + " mode=from-run\n", "search done"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	for _, leak := range []string{"VAR IN ARGV", "VAR IN ANOTHER ENVIRONMENT", "VAR IN A FILE", "environments of other processes read: 0\n"} {
		if strings.Contains(log, leak) {
			t.Errorf("log contains %q:\n%s", leak, log)
		}
	}
}

func testTransfers(t *testing.T, h Harness) {
	checkout := t.TempDir()
	mustWrite(t, filepath.Join(checkout, "bin/tool.sh"), "#!/bin/sh\necho tool ran\n", 0o755)
	mustWrite(t, filepath.Join(checkout, "data/file.txt"), "data\n", 0o640)
	must(t, os.Symlink("../data/file.txt", filepath.Join(checkout, "bin/link")))
	must(t, os.MkdirAll(filepath.Join(checkout, "empty"), 0o755))
	src := `on: push
steps:
  - name: check
    run: |
      ./bin/tool.sh
      test -L bin/link && cat bin/link
      test -d empty
      mkdir -p "$KNOTLESS_RUN_OUTPUTS/sub"
      cp bin/tool.sh "$KNOTLESS_RUN_OUTPUTS/sub/tool.sh"
      ln -s tool.sh "$KNOTLESS_RUN_OUTPUTS/sub/tool-link"
      echo result > "$KNOTLESS_RUN_OUTPUTS/result.txt"
`
	out := filepath.Join(t.TempDir(), "outputs")
	res := engine(t, h).Run(context.Background(), run.Request{RunID: runID(t), Workflow: parse(t, src), Checkout: checkout, Outputs: out, Trusted: true})
	if res.Status != run.Success {
		t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
	}
	if !strings.Contains(string(res.Log), "tool ran") || !strings.Contains(string(res.Log), "data") {
		t.Errorf("log:\n%s", res.Log)
	}
	if got := strings.Join(res.Outputs, ","); got != "result.txt,sub/tool-link,sub/tool.sh" {
		t.Errorf("outputs = %s", got)
	}
	fi, err := os.Stat(filepath.Join(out, "sub/tool.sh"))
	if err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("output sub/tool.sh lost its executable bit: %v %v", fi, err)
	}
	if link, err := os.Readlink(filepath.Join(out, "sub/tool-link")); err != nil || link != "tool.sh" {
		t.Errorf("output link = %q, %v", link, err)
	}
}

func testHostileOutputs(t *testing.T, h Harness) {
	parent := t.TempDir()
	out := filepath.Join(parent, "outputs")
	src := `on: push
steps:
  - name: escape
    run: |
      ln -s ../../../../../../etc "$KNOTLESS_RUN_OUTPUTS/escape"
      echo x > "$KNOTLESS_RUN_OUTPUTS/plain"
`
	res := engine(t, h).Run(context.Background(), run.Request{RunID: runID(t), Workflow: parse(t, src), Checkout: t.TempDir(), Outputs: out, Trusted: true})
	// The entry is named as the archive has it: "escape" or "./escape".
	if res.Status != run.Error || !strings.Contains(res.Error, `escape": symbolic link to "../../../../../../etc" points outside the target`) {
		t.Errorf("status %s (%s), want error naming the entry", res.Status, res.Error)
	}
	entries, _ := os.ReadDir(parent)
	if len(entries) != 1 || entries[0].Name() != "outputs" {
		t.Errorf("something was written beside the outputs: %v", entries)
	}
	if _, err := os.Lstat(filepath.Join(out, "escape")); err == nil {
		t.Errorf("the escaping link was created")
	}
}

// testSessionSteps drives a session directly: offsets, kill, leftovers.
func testSessionSteps(t *testing.T, h Harness) {
	ctx := context.Background()
	ex := h.New(t)
	sess, err := ex.Start(ctx, executor.Spec{RunID: runID(t), Runner: "did:plc:conformance", Image: h.Image, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer func() {
		if err := sess.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	script := func(id, text string) {
		t.Helper()
		var tarball bytes.Buffer
		must(t, tarOne(&tarball, id, text))
		must(t, sess.Put(ctx, sess.Dirs().Steps, &tarball))
	}
	start := func(id string) {
		t.Helper()
		p := "cd " + sess.Dirs().Work + "\nexec sh -e " + sess.Dirs().Steps + "/" + id + "\n"
		must(t, sess.StartStep(ctx, id, []byte(p)))
	}

	script("1", "echo 0123456789\n")
	start("1")
	var out bytes.Buffer
	exit, err := sess.FollowStep(ctx, "1", 5, &out)
	if err != nil || exit.Code != 0 || out.String() != "56789\n" {
		t.Errorf("follow from offset 5: %q exit %d err %v; want %q", out.String(), exit.Code, err, "56789\n")
	}

	script("2", "sh -c 'sleep 300; :' knotless-kill-marker &\nsleep 300\n")
	start("2")
	short, cancel := context.WithTimeout(ctx, time.Second)
	_, err = sess.FollowStep(short, "2", 0, io.Discard)
	cancel()
	if err == nil {
		t.Fatalf("a hanging step ended by itself")
	}
	must(t, sess.KillStep(ctx, "2"))
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := sess.FollowStep(waitCtx, "2", 0, io.Discard); err != nil && waitCtx.Err() != nil {
		t.Errorf("killed step did not end: %v", err)
	}

	script("3", "grep -l 'knotless-kill-marke[r]' /proc/[0-9]*/cmdline 2>/dev/null | while read f; do echo \"left: $f\"; done; echo checked\n")
	start("3")
	out.Reset()
	if _, err := sess.FollowStep(ctx, "3", 0, &out); err != nil || strings.Contains(out.String(), "left:") || !strings.Contains(out.String(), "checked") {
		t.Errorf("after kill: %q, %v; want no process of the killed step", out.String(), err)
	}
}

// testRootTransfer: an executor whose Dirs have a Root takes one tar
// stream there that fills the work and steps directories at once (the
// engine's one transfer for the checkout and the step scripts), and
// leaves what is in them.
func testRootTransfer(t *testing.T, h Harness) {
	ctx := context.Background()
	ex := h.New(t)
	sess, err := ex.Start(ctx, executor.Spec{RunID: runID(t), Runner: "did:plc:conformance", Image: h.Image, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer func() {
		if err := sess.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	d := sess.Dirs()
	if d.Root == "" {
		t.Skip("this executor puts each directory on its own (Dirs.Root is empty)")
	}
	if path.Dir(d.Work) != d.Root || path.Dir(d.Steps) != d.Root {
		t.Fatalf("Dirs %+v: Work and Steps are not children of Root", d)
	}
	put := func(files map[string]string) {
		t.Helper()
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for name, body := range files {
			must(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(body))}))
			_, err := tw.Write([]byte(body))
			must(t, err)
		}
		must(t, tw.Close())
		must(t, sess.Put(ctx, d.Root, &b))
	}
	work, steps := path.Base(d.Work), path.Base(d.Steps)
	put(map[string]string{work + "/first.txt": "first\n"})
	put(map[string]string{work + "/sub/second.txt": "second\n", steps + "/1": "cat first.txt sub/second.txt\n"})
	must(t, sess.StartStep(ctx, "1", []byte("cd "+d.Work+"\nexec sh -e "+d.Steps+"/1\n")))
	var out bytes.Buffer
	if exit, err := sess.FollowStep(ctx, "1", 0, &out); err != nil || exit.Code != 0 || out.String() != "first\nsecond\n" {
		t.Errorf("step reading what the root transfers put: %q exit %d err %v; want both files", out.String(), exit.Code, err)
	}
}

// testBounds: a checkout or outputs past the run's bounds end the run
// error naming the bound's flag, and nothing of the outputs is kept.
func testBounds(t *testing.T, h Harness) {
	const mib = 1 << 20
	bounded := func(checkout, outputs int64, files int64) (run.Bound, run.Bound) {
		return run.Bound{Limits: tarstream.Limits{MaxBytes: checkout, MaxFiles: files}, BytesName: "--max-checkout", FilesName: "--max-files"},
			run.Bound{Limits: tarstream.Limits{MaxBytes: outputs, MaxFiles: files}, BytesName: "--max-outputs", FilesName: "--max-files"}
	}
	big := t.TempDir()
	mustWrite(t, filepath.Join(big, "big"), strings.Repeat("x", 2*mib), 0o644)
	tests := []struct {
		name                    string
		checkout                string // "" = an empty temporary directory
		maxCheckout, maxOutputs int64
		maxFiles                int64
		script                  string
		wantStatus              run.Status
		wantError               string
		wantStep                run.Status
		wantOutputs             string
	}{
		{
			name: "outputs over --max-outputs", maxCheckout: mib, maxOutputs: mib, maxFiles: 100,
			// A locked directory first: it must not keep the staged
			// outputs from being removed.
			script:     "mkdir -m 000 \"$KNOTLESS_RUN_OUTPUTS/locked\"; mkdir -m 644 \"$KNOTLESS_RUN_OUTPUTS/noexec\"; dd if=/dev/zero of=\"$KNOTLESS_RUN_OUTPUTS/big\" bs=1024 count=2048 2>/dev/null",
			wantStatus: run.Error, wantError: "outputs exceed --max-outputs (1048576 bytes)", wantStep: run.Success,
		},
		{
			name: "outputs over --max-files", maxCheckout: mib, maxOutputs: mib, maxFiles: 10,
			script:     "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do echo $i > \"$KNOTLESS_RUN_OUTPUTS/f$i\"; done",
			wantStatus: run.Error, wantError: "outputs exceed --max-files (10 files)", wantStep: run.Success,
		},
		{
			name: "checkout over --max-checkout", checkout: big, maxCheckout: mib, maxOutputs: mib, maxFiles: 100,
			script:     "echo never > \"$KNOTLESS_RUN_OUTPUTS/never\"",
			wantStatus: run.Error, wantError: "checkout exceed --max-checkout (1048576 bytes)", wantStep: run.Skipped,
		},
		{
			name: "within the bounds", maxCheckout: 4 * mib, maxOutputs: 4 * mib, maxFiles: 10,
			checkout:   big,
			script:     "mkdir \"$KNOTLESS_RUN_OUTPUTS/d\"; cp big \"$KNOTLESS_RUN_OUTPUTS/d/big\"",
			wantStatus: run.Success, wantStep: run.Success, wantOutputs: "d/big",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkout := tt.checkout
			if checkout == "" {
				checkout = t.TempDir()
			}
			parent := t.TempDir()
			out := filepath.Join(parent, "outputs")
			cb, ob := bounded(tt.maxCheckout, tt.maxOutputs, tt.maxFiles)
			eng := run.New(run.Config{Executor: h.New(t), DefaultImage: h.Image, Runner: "did:plc:conformance", CleanupTimeout: time.Minute,
				Checkout: cb, Outputs: ob})
			src := "on: push\nsteps:\n  - name: write\n    run: |\n      " + tt.script + "\n"
			res := eng.Run(context.Background(), run.Request{RunID: runID(t), Workflow: parse(t, src), Checkout: checkout, Outputs: out, Trusted: true})
			if res.Status != tt.wantStatus || !strings.Contains(res.Error, tt.wantError) || res.Steps[0].Status != tt.wantStep {
				t.Errorf("status %s (%q), step %s; want %s with an error containing %q, step %s\nlog:\n%s",
					res.Status, res.Error, res.Steps[0].Status, tt.wantStatus, tt.wantError, tt.wantStep, res.Log)
			}
			if got := strings.Join(res.Outputs, ","); got != tt.wantOutputs {
				t.Errorf("outputs = %q, want %q", got, tt.wantOutputs)
			}
			// Nothing past the bound: no output file and no staging
			// directory is left.
			var left []string
			_ = filepath.WalkDir(parent, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					rel, _ := filepath.Rel(parent, p)
					left = append(left, filepath.ToSlash(rel))
				}
				return nil
			})
			want := ""
			if tt.wantOutputs != "" {
				want = "outputs/" + tt.wantOutputs
			}
			if got := strings.Join(left, ","); got != want {
				t.Errorf("files on disk after the run: %q, want %q", got, want)
			}
			if entries, _ := os.ReadDir(parent); len(entries) > 1 {
				t.Errorf("something was left beside the outputs: %v", entries)
			}
		})
	}
}

// testCaches: cold then warm through the store, and a hostile step (a
// link to / inside the cache, a huge sparse file) neither escapes nor
// fills the store, nor fails its run, nor spoils the cache.
func testCaches(t *testing.T, h Harness) {
	dir := h.CachePath
	if dir == "" {
		dir = "/cache"
	}
	store, err := cache.Open(cache.Config{Dir: t.TempDir(), MaxBytes: 1 << 20})
	must(t, err)
	eng := run.New(run.Config{Executor: h.New(t), DefaultImage: h.Image, Runner: "did:plc:conformance", CleanupTimeout: time.Minute, Caches: store})
	scope := run.CacheScope{Repo: "conformance-" + runID(t)}
	runOnce := func(order, script string) *run.Result {
		t.Helper()
		scope.Order = order
		src := "on: push\ncache: [" + dir + "]\nsteps:\n  - name: use\n    run: |\n      " + strings.ReplaceAll(strings.ReplaceAll(script, "$C", dir), "\n", "\n      ") + "\n"
		res := eng.Run(context.Background(), run.Request{RunID: runID(t), Workflow: parse(t, src), Checkout: t.TempDir(), Trusted: true, Cache: scope})
		if res.Status != run.Success {
			t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
		}
		return res
	}
	read := "if [ -f $C/warm ]; then echo \"warm: $(cat $C/warm)\"; else echo \"no warm file\"; fi"

	res := runOnce("1", read+"\necho first > $C/warm")
	for _, want := range []string{"cache " + dir + ": cold", "no warm file", "cache " + dir + ": saved"} {
		if !strings.Contains(string(res.Log), want) {
			t.Errorf("first run: log lacks %q:\n%s", want, res.Log)
		}
	}
	hostile := []struct{ script, want string }{
		{"echo second > $C/warm\nln -s / $C/root", "points outside"},
		{"echo third > $C/warm\ndd if=/dev/zero of=$C/huge bs=1 count=1 seek=67108864 2>/dev/null", "exceeds --cache-max"},
	}
	for i, hs := range hostile {
		res = runOnce(strconv.Itoa(i+2), read+"\n"+hs.script)
		for _, want := range []string{"cache " + dir + ": restored", "warm: first", "warning: cache " + dir + " not saved", hs.want} {
			if !strings.Contains(string(res.Log), want) {
				t.Errorf("hostile run %d: log lacks %q:\n%s", i+1, want, res.Log)
			}
		}
	}
	res = runOnce("4", read+"\ntest ! -e $C/root && test ! -e $C/huge && echo clean")
	for _, want := range []string{"warm: first", "clean"} {
		if !strings.Contains(string(res.Log), want) {
			t.Errorf("last run: log lacks %q:\n%s", want, res.Log)
		}
	}
	var stored int64
	_ = filepath.WalkDir(store.Dir(), func(p string, d os.DirEntry, err error) error {
		if fi, ierr := os.Lstat(p); err == nil && ierr == nil && fi.Mode().IsRegular() {
			stored += fi.Size()
		}
		return nil
	})
	if stored > 1<<20 {
		t.Errorf("the store holds %d bytes after a refused hostile save", stored)
	}
}

// testCacheTaint: a file a secret-bearing push left in its cache
// reaches no pull, even through a later push granted no secret that
// saves the cache on (taint follows lineage): that push starts from the
// clean lineage, and the pull after it sees that push's file only.
func testCacheTaint(t *testing.T, h Harness) {
	dir := h.CachePath
	if dir == "" {
		dir = "/cache"
	}
	store, err := cache.Open(cache.Config{Dir: t.TempDir(), MaxBytes: 1 << 20})
	must(t, err)
	eng := run.New(run.Config{Executor: h.New(t), DefaultImage: h.Image, Runner: "did:plc:conformance", CleanupTimeout: time.Minute, Caches: store})
	scope := run.CacheScope{Repo: "conformance-" + runID(t)}
	secret := "taint-" + runID(t) + "-value"
	show := "if [ -f $C/token ]; then echo \"token file: $(cat $C/token)\"; else echo \"no token file\"; fi\n" +
		"if [ -f $C/who ]; then echo \"seen: $(cat $C/who)\"; fi"
	runOnce := func(order string, trusted bool, grant, script string) string {
		t.Helper()
		scope.Order = order
		src := "on: [push, pull]\ncache: [" + dir + "]\n"
		step := "  - name: use\n"
		if grant != "" {
			src += "secrets: [" + grant + "]\n"
			step += "    secrets: [" + grant + "]\n"
		}
		body := strings.ReplaceAll(strings.ReplaceAll(show+"\n"+script, "$C", dir), "\n", "\n      ")
		src += "steps:\n" + step + "    run: |\n      " + body + "\n"
		res := eng.Run(context.Background(), run.Request{RunID: runID(t), Workflow: parse(t, src), Checkout: t.TempDir(),
			Trusted: trusted, Secrets: map[string]string{"TOKEN": secret}, Cache: scope})
		if res.Status != run.Success {
			t.Fatalf("status %s (%s), log:\n%s", res.Status, res.Error, res.Log)
		}
		return string(res.Log)
	}
	expect := func(what, log string, want, notWant []string) {
		t.Helper()
		for _, s := range want {
			if !strings.Contains(log, s) {
				t.Errorf("%s: log lacks %q:\n%s", what, s, log)
			}
		}
		for _, s := range notWant {
			if strings.Contains(log, s) {
				t.Errorf("%s: log has %q:\n%s", what, s, log)
			}
		}
	}

	log := runOnce("1", true, "TOKEN", "printf %s \"$TOKEN\" > $C/token\necho secret-push > $C/who")
	expect("secret-bearing push", log, []string{"cache " + dir + ": saved", "tainted"}, nil)
	log = runOnce("2", true, "", "echo plain-push > $C/who")
	expect("push granted no secret", log, []string{"no token file", "cache " + dir + ": saved"}, []string{"token file:", secret, "seen: secret-push"})
	log = runOnce("", false, "", "")
	expect("pull", log, []string{"no token file", "seen: plain-push"}, []string{"token file:", secret, "seen: secret-push"})
	log = runOnce("3", true, "TOKEN", "")
	expect("secret-bearing push after them", log, []string{"seen: plain-push"}, nil)
}
