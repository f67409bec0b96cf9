package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/lander"
	"knotless.dev/run/internal/parts/scheduler"
)

// childEnv names the environment variable that makes the test binary a
// lander process (landerChild) instead of running tests: the test can
// then SIGKILL a real process.
const childEnv = "KNOTLESS_TEST_LANDER"

// childConfig is what the lander process is told.
type childConfig struct {
	Runner, PDS, PLCURL, Password, Owner string
	StateDir, CacheDir, ShellRoot        string
	Secrets                              []scheduler.OperatorSecret
}

// landerChild runs the daemon with --queue as a child process told by
// childEnv, until SIGTERM; it reports whether it did.
func landerChild() bool {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return false
	}
	var c childConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := daemon.Run(ctx, daemon.Config{
		Account: daemon.Account{Runner: syntax.DID(c.Runner), PDS: c.PDS, Password: c.Password,
			Directory: &identity.BaseDirectory{PLCURL: c.PLCURL, SkipHandleVerification: true}},
		Sources:   daemon.Sources{Targets: []ingest.Target{{Owner: syntax.AtIdentifier(c.Owner), Name: "hello"}}},
		Intake:    intake.Config{Poll: 300 * time.Millisecond},
		Engine:    run.Config{Executor: shell.New(shell.Config{Root: c.ShellRoot})},
		Scheduler: scheduler.Config{Concurrency: 1, Secrets: c.Secrets},
		Lander:    lander.Config{Queue: true, Batch: lander.DefaultBatch},
		StopWait:  time.Minute, StateDir: c.StateDir, CacheDir: c.CacheDir,
		Git:                  mirror.Options{Policy: mirror.Policy{AllowLocal: true}},
		UnsafeShellUntrusted: true, // the merge queue's work, on the shell executor on purpose
		Logger:               slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

// startLander starts the lander as a child process logging to log.
func (m *mqWorld) startLander(log *os.File) *exec.Cmd {
	m.t.Helper()
	raw, err := json.Marshal(childConfig{
		Runner: m.Runner.DID.String(), PDS: srv.URL, PLCURL: srv.PLCURL, Password: m.Password, Owner: m.Owner.DID.String(),
		StateDir: m.stateDir, CacheDir: m.cacheDir, ShellRoot: m.shellRoot,
		Secrets: []scheduler.OperatorSecret{{Name: "TOKEN", Value: "operator-token", Repos: []string{m.RepoURI.String()}}},
	})
	if err != nil {
		m.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// TestMergeQueueLanderKilled: the lander is SIGKILLed while its batch
// runs (on the shell executor, which cannot take a run over); started
// again on the same state, it does not run the batch's started step
// again: the batch's check ends error ("runner restarted during step"),
// the batch fails, and the bisection lands each pull once. Nothing is
// lost or landed twice, and each batch has one check per workflow.
func TestMergeQueueLanderKilled(t *testing.T) {
	t.Parallel()
	m := newMQWorld(t, nil, nil)
	m.addSlowBatch() // so that the kill lands mid-batch
	base := m.head()
	p1, c1 := m.pull("one", "", map[string]string{"one.txt": "1\n"})
	p2, c2 := m.pull("two", "", map[string]string{"two.txt": "2\n"})
	m.enqueue(p1, c1)
	m.enqueue(p2, c2)

	logFile, err := os.Create(filepath.Join(t.TempDir(), "lander.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	dump := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	first := m.startLander(logFile)
	m.waitSlowRunning(dump)
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	if got := m.head(); got != base {
		t.Fatalf("main moved to %s before the batch's checks ended", got)
	}
	fmt.Fprintln(logFile, "=== lander killed; starting again")
	m.startLander(logFile)

	deadline := time.Now().Add(2 * time.Minute)
	for len(list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("not two landings after the restart\nlander log:\n%s", dump())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Give a double landing the time to show.
	time.Sleep(2 * time.Second)
	if diff := cmp.Diff([]string{"one", "two"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s\nlander log:\n%s", diff, dump())
	}
	if n := len(list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)); n != 2 {
		t.Errorf("%d landings, want 2 (each pull alone, after the killed batch failed)", n)
	}
	batches := list[forge.Batch](m, m.Runner.DID, forge.CollectionBatch)
	var failed, landed int
	for _, b := range batches {
		switch b.Value.Status {
		case forge.BatchLanded:
			landed++
		case forge.BatchFailed:
			failed++
		}
	}
	if len(batches) != 3 || failed != 1 || landed != 2 {
		t.Errorf("batches: %+v; want the killed one failed and two landed", batches)
	}
	perBatch := map[string]int{}
	restarted := 0
	for _, c := range list[forge.Check](m, m.Runner.DID, forge.CollectionCheck) {
		if c.Value.Subject.Kind != forge.KindBatch {
			continue
		}
		perBatch[c.Value.Subject.Event+" "+c.Value.Workflow]++
		switch {
		case c.Value.Status == "error" && c.Value.Workflow == "slow" && strings.Contains(c.Value.Error, "runner restarted during step 1/1"):
			restarted++
		case c.Value.Status != "success" && c.Value.Status != "cancelled":
			t.Errorf("batch check %s: %s (%s)", c.Value.Workflow, c.Value.Status, c.Value.Error)
		}
	}
	if restarted != 1 {
		t.Errorf("%d checks say the runner restarted during the slow step, want the killed batch's one", restarted)
	}
	for k, n := range perBatch {
		if n != 1 {
			t.Errorf("%d checks of %s, want one", n, k)
		}
	}
}

// addSlowBatch adds a batch workflow that sleeps to the origin's main.
func (m *mqWorld) addSlowBatch() {
	m.t.Helper()
	m.Src.Git("fetch", "--quiet", m.origin, "main")
	m.Src.Git("checkout", "--quiet", "main")
	m.Src.Git("reset", "--quiet", "--hard", "FETCH_HEAD")
	m.Src.Commit("main", map[string]string{".knotless/workflows/slow.yaml": workflowFile(`
on: batch
steps:
  - run: sleep 3
`)})
	m.Src.Git("push", "--quiet", m.origin, "main")
}

// waitSlowRunning waits until the slow batch workflow runs.
func (m *mqWorld) waitSlowRunning(log func() string) {
	m.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		for _, c := range list[forge.Check](m, m.Runner.DID, forge.CollectionCheck) {
			if c.Value.Workflow == "slow" && c.Value.Status == forge.StatusRunning {
				return
			}
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("the batch never ran\nlog:\n%s", log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestMergeQueueHeadMovesMidBatch: a pull whose head moves while its
// batch runs leaves the queue (headMoved); the batch is void and built
// again without it, and the other pull lands.
func TestMergeQueueHeadMovesMidBatch(t *testing.T) {
	t.Parallel()
	m := newMQWorld(t, nil, nil)
	m.addSlowBatch()
	base := m.head()
	p1, c1 := m.pull("one", "", map[string]string{"one.txt": "1\n"})
	p2, c2 := m.pull("two", "", map[string]string{"two.txt": "2\n"})
	m.enqueue(p1, c1)
	m.enqueue(p2, c2)
	m.start(m.config())
	m.waitSlowRunning(m.logText)
	moved := m.fork.Commit("two", map[string]string{"two.txt": "2 again\n"})
	m.Put(m.author, forge.CollectionPull, p2.RecordKey().String(), forge.Pull{
		Type: forge.CollectionPull, Repo: m.RepoURI.String(), Base: "main",
		Head:  forge.PullHead{Source: "file://" + m.fork.Dir, Ref: "refs/heads/two", Commit: moved},
		Title: "two", State: forge.PullOpen, CreatedAt: forge.Now(),
	})
	m.waitFor("landing", 2*time.Minute, func() bool {
		return len(list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)) > 0
	})
	if diff := cmp.Diff([]string{"one"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	ej := m.ejections(m.Runner.DID)[p2.String()]
	if ej.Reason != forge.EjectHeadMoved || ej.Commit != c2 {
		t.Errorf("ejection of the moved pull: %+v; want headMoved at %s", ej, c2)
	}
	statuses := map[string]int{}
	for _, b := range list[forge.Batch](m, m.Runner.DID, forge.CollectionBatch) {
		statuses[b.Value.Status]++
	}
	if diff := cmp.Diff(map[string]int{forge.BatchRebuilt: 1, forge.BatchLanded: 1}, statuses); diff != "" {
		t.Errorf("batch statuses (-want +got):\n%s", diff)
	}
}
