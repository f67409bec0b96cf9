package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/internal/parts/state"
)

// TestFailingStep: a failing workflow gives failure naming the step.
func TestFailingStep(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/test.yaml": workflowFile(`
on: [push]
steps:
  - name: ok
    run: echo fine
  - name: broken
    run: exit 3
  - name: never
    run: echo unreachable
`)})
	w.start(w.config())
	_, got := w.waitFinal("test", commit, 90*time.Second)
	if got.Status != "failure" || got.FailedStep != "broken" || !strings.Contains(got.Error, `"broken"`) {
		t.Fatalf("got %s failedStep=%q error=%q, want failure in step broken", got.Status, got.FailedStep, got.Error)
	}
	if c := got.Steps[1].ExitCode; c == nil || *c != 3 {
		t.Errorf("step broken exit %v, want 3", c)
	}
	if got.Steps[2].Status != "skipped" {
		t.Errorf("step never: %s, want skipped", got.Steps[2].Status)
	}
}

const secretsWorkflow = `
on: [push, pull]
secrets: [DEPLOY_TOKEN, OPERATOR_TOKEN]
steps:
  - name: use
    secrets: [DEPLOY_TOKEN, OPERATOR_TOKEN]
    run: |
      echo "deploy=${DEPLOY_TOKEN:-unset} operator=${OPERATOR_TOKEN:-unset}"
      test "$DEPLOY_TOKEN" = "s3cret-deploy" && echo deploy-value-ok || echo deploy-value-absent
`

// TestSecrets: a secret sealed to the runner reaches a push run and is
// masked in the log blob; an operator secret takes precedence; a pull
// (with --pulls) gets no secrets at all; a granted name the runner has
// no value for is named, without a value, in an error check.
func TestSecrets(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	key, _, err := state.LoadKey(w.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	seal := func(name, value string) {
		sealed, err := forge.SealSecret(key.Public, forge.Envelope{
			Repo: w.RepoURI.String(), Name: name, Runner: w.Runner.DID.String(), Scope: forge.ScopePush, Value: []byte(value),
		})
		if err != nil {
			t.Fatal(err)
		}
		w.Put(w.Owner, forge.CollectionSecret, "hello."+name, forge.Secret{
			Type: forge.CollectionSecret, Repo: w.RepoURI.String(), Name: name, Runner: w.Runner.DID.String(),
			Key: key.PublicString(), Scope: forge.ScopePush, Sealed: sealed, CreatedAt: forge.Now(),
		})
	}
	seal("DEPLOY_TOKEN", "s3cret-deploy")
	seal("OPERATOR_TOKEN", "sealed-but-overridden")
	_, commit := w.Push(map[string]string{".knotless/workflows/deploy.yaml": workflowFile(secretsWorkflow)})

	// A pull from another account, from its own clone, onto main.
	author, err := srv.CreateAccount(ctx, "author")
	if err != nil {
		t.Fatal(err)
	}
	fork := w.Src.Clone(t)
	head := fork.Commit("feature", map[string]string{"feature.txt": "new\n"})
	pullURI := w.Put(author, forge.CollectionPull, "", forge.Pull{
		Type: forge.CollectionPull, Repo: w.RepoURI.String(), Base: "main",
		Head:  forge.PullHead{Source: "file://" + fork.Dir, Ref: "refs/heads/feature", Commit: head},
		Title: "a feature", State: forge.PullOpen, CreatedAt: forge.Now(),
	})

	w.start(w.config(func(c *daemon.Config) {
		c.Sources.Pulls = true
		// The author wrote the pull before the runner started and is
		// not a watched account: listing the PDS's accounts finds it.
		c.Sources.Discover = true
		c.Scheduler.Secrets = []scheduler.OperatorSecret{{Name: "OPERATOR_TOKEN", Value: "operator-wins", Repos: []string{w.RepoURI.String()}}}
	}))
	_, push := w.waitFinal("deploy", commit, 90*time.Second)
	if push.Status != "success" {
		t.Fatalf("push: %s (%s)", push.Status, push.Error)
	}
	log := string(w.Blob(push.Log.Ref.String()))
	for _, leaked := range []string{"s3cret-deploy", "operator-wins", "sealed-but-overridden"} {
		if strings.Contains(log, leaked) {
			t.Errorf("push log shows the secret value %q:\n%s", leaked, log)
		}
	}
	if !strings.Contains(log, "deploy-value-ok") || strings.Contains(log, "=unset") {
		t.Errorf("push log: the secrets did not reach the step:\n%s", log)
	}

	_, pull := w.waitFinal("deploy", head, 90*time.Second)
	if pull.Subject.Kind != "pull" || pull.Subject.Event != pullURI.String() {
		t.Errorf("pull subject %+v", pull.Subject)
	}
	if pull.Status != "success" {
		t.Fatalf("pull: %s (%s)", pull.Status, pull.Error)
	}
	plog := string(w.Blob(pull.Log.Ref.String()))
	if !strings.Contains(plog, "deploy=unset operator=unset") || !strings.Contains(plog, "secret DEPLOY_TOKEN withheld") {
		t.Errorf("pull log: want secrets withheld and named:\n%s", plog)
	}

	// A workflow granting a name nobody gave a value for.
	_, commit2 := w.Push(map[string]string{".knotless/workflows/deploy.yaml": workflowFile(`
on: [push]
secrets: [MISSING_TOKEN]
steps:
  - name: use
    secrets: [MISSING_TOKEN]
    run: echo "$MISSING_TOKEN"
`)})
	_, missing := w.waitFinal("deploy", commit2, 90*time.Second)
	if missing.Status != "error" || !strings.Contains(missing.Error, "MISSING_TOKEN") {
		t.Errorf("ungranted secret: got %s %q, want an error naming MISSING_TOKEN", missing.Status, missing.Error)
	}
}

// TestReconcileAfterDowntime: a push written while the runner is stopped
// runs when it starts again, and a second start runs nothing twice.
func TestReconcileAfterDowntime(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	wf := map[string]string{".knotless/workflows/build.yaml": workflowFile(`
on: [push]
steps:
  - name: build
    run: echo built
`)}
	_, first := w.Push(wf)
	stop := w.start(w.config())
	w.waitFinal("build", first, 90*time.Second)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	wf["greeting.txt"] = "while down\n"
	_, second := w.Push(wf)
	stop = w.start(w.config())
	_, got := w.waitFinal("build", second, 90*time.Second)
	if got.Status != "success" {
		t.Fatalf("got %s", got.Status)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	w.start(w.config())
	time.Sleep(2 * time.Second) // a few reconciles
	count := map[string]int{}
	for _, c := range w.Checks() {
		count[c.Value.Subject.Commit]++
	}
	if count[first] != 1 || count[second] != 1 || len(count) != 2 {
		t.Errorf("checks per commit: %v, want one each for %s and %s", count, first[:8], second[:8])
	}
	if n := len(w.checkLog.statuses("build", second)); n != 2 {
		t.Errorf("check writes for the second push: %v, want running, success only", w.checkLog.statuses("build", second))
	}
}

// TestRestartMidRun: a runner killed mid-run (no handover) leaves a
// running check; the next start runs the work again under the same check
// key, so there is no second check.
func TestRestartMidRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	marker := filepath.Join(t.TempDir(), "started")
	_, commit := w.Push(map[string]string{".knotless/workflows/slow.yaml": workflowFile(`
on: [push]
steps:
  - name: slow
    run: |
      if [ ! -e ` + marker + ` ]; then touch ` + marker + `; sleep 600; fi
      echo second attempt
`)})
	// The first process is "killed": its context ends and its stop wait
	// is zero, so the run is cancelled, as a kill would leave it.
	stop := w.start(w.config(func(c *daemon.Config) { c.StopWait = 0 }))
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run did not start\n%s", w.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	w.start(w.config())
	key, got := w.waitFinal("slow", commit, 90*time.Second)
	if got.Status != "success" {
		t.Fatalf("got %s (%s)", got.Status, got.Error)
	}
	n := 0
	for _, c := range w.Checks() {
		if c.Value.Workflow == "slow" {
			n++
			if c.URI.RecordKey().String() != key {
				t.Errorf("a second check %s", c.URI)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d checks for the work, want 1", n)
	}
}

// TestCorruptState: a corrupt state.json stops the start with an error
// naming the file, and the file is left as it was.
func TestCorruptState(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	name := filepath.Join(w.stateDir, "state.json")
	if err := os.WriteFile(name, []byte(`{"version": 1, "runs": {`), 0o600); err != nil {
		t.Fatal(err)
	}
	err := daemon.Run(context.Background(), w.config())
	if err == nil || !strings.Contains(err.Error(), name) {
		t.Fatalf("got %v, want an error naming %s", err, name)
	}
	if b, _ := os.ReadFile(name); string(b) != `{"version": 1, "runs": {` {
		t.Errorf("state file was rewritten: %q", b)
	}
}

// TestFirehoseWakes: with listing only every hour, a push written while
// the runner runs is seen through the PDS's event stream.
func TestFirehoseWakes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.start(w.config(func(c *daemon.Config) {
		c.Intake.Poll = time.Hour
		c.Intake.Firehose = true
	}))
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(w.logText(), "following events") {
		if time.Now().After(deadline) {
			t.Fatalf("no event subscription\n%s", w.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, commit := w.Push(map[string]string{".knotless/workflows/build.yaml": "on: [push]\nsteps:\n  - name: build\n    run: echo built\n"})
	_, got := w.waitFinal("build", commit, 60*time.Second)
	if got.Status != "success" {
		t.Fatalf("got %s", got.Status)
	}
	if !strings.Contains(w.logText(), "records changed") {
		t.Errorf("the run was not woken by an event")
	}
}
