package daemon

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

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/run"
	"knotless.dev/run/internal/workflow"
)

// The daemon served on a rig: reconcile, queue, workers, checks and the
// handover, with the outside in memory and time in a synctest bubble.

func TestServeRunsAPush(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.exec.Script = func(_, id string) fakeexec.Step { return fakeexec.Step{Output: "step " + id + "\n"} }
		r.exec.Outputs = map[string]string{"plot.png": "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "notes.txt": "text"}
		r.git.setWorkflows(ciWorkflow("ci", "make", "make test"), ciWorkflow("pulls-only"))
		r.git.workflows[1].On = []workflow.Trigger{workflow.Pull}
		ev := push("3k1", "c1")
		r.in.set(ev)
		stop := serveRig(t, r.d)
		synctest.Wait()
		stop()

		if diff := cmp.Diff([]string{"queued", "running", "success"}, r.statuses(ev, "ci")); diff != "" {
			t.Errorf("check statuses (-want +got):\n%s", diff)
		}
		c := r.final(ev, "ci")
		if c.Log == nil || len(c.Steps) != 2 || c.Steps[1].Status != "success" {
			t.Errorf("final check: log %v, steps %+v", c.Log, c.Steps)
		}
		if len(c.Outputs) != 1 || c.Outputs[0].Path != "plot.png" {
			t.Errorf("outputs %+v, want the image alone", c.Outputs)
		}
		if len(r.statuses(ev, "pulls-only")) != 0 {
			t.Error("a workflow for pulls only got a check on a push")
		}
		st := saved(t, r.d)
		if _, done := st.Done[ev.Key()]; !done || len(st.Runs) != 0 {
			t.Errorf("state.json: done %v, runs %v", st.Done, st.Runs)
		}
		if _, seen := st.Repos[testRepo]; !seen {
			t.Error("the repository is not noted in state.json")
		}
		if !r.notes.has("READY=1") || !r.notes.has("STOPPING=1") {
			t.Errorf("notifications %q", r.notes.msgs)
		}
		if left, _ := os.ReadDir(filepath.Join(r.d.cfg.CacheDir, "runs")); len(left) != 0 {
			t.Errorf("run directories left: %v", left)
		}
	})
}

// What cannot run gets one final error check, and the event is done:
// a failing step, a pull that does not merge, a refused source, an
// unreadable workflow file.
func TestServeErrorChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		ev       ingest.Event
		setup    func(r *rig)
		workflow string
		status   string
		errHas   string
	}{
		{"failing step", push("3k1", "c1"), func(r *rig) {
			r.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Output: "boom\n", Code: 3} }
		}, "ci", "failure", `step "ci-a" exited with code 3`},
		{"conflict", pull("did:plc:author", "3p1", "h1"), func(r *rig) { r.git.conflict = true },
			"ci", "error", "merge conflict"},
		{"refused source", push("3k1", "c1"), func(r *rig) { r.git.fetchErr = fmt.Errorf("source file:///etc: %w", mirror.ErrRefused) },
			refusedCheck, "error", "file:///etc"},
		{"invalid workflow file", push("3k1", "c1"), func(r *rig) {
			r.git.bad = []error{workflow.Errors{{Position: workflow.Position{File: ".knotless/workflows/lint.yml", Line: 3}, Msg: "steps: required"}}}
		}, "lint", "error", "invalid workflow file"},
		{"executor down", push("3k1", "c1"), func(r *rig) {
			r.d.faults.swept = false
			r.exec.SetSweepErr(errors.New("cluster unreachable"))
			r.d.degrade(errors.New("cluster unreachable"))
		},
			"ci", "error", "cluster unreachable"},
		{"pull over the operator's maximum", pull("did:plc:author", "3p1", "h1"), func(r *rig) {
			r.git.workflows[0].Image = "evil.test/miner"
			r.d.engine = run.New(run.Config{Executor: r.exec, Max: run.Maximums{Images: []string{"registry.test/*"}}})
		}, "ci", "error", "is not allowed by --allow-image"},
		{"untrusted run asks for a secret", pull("did:plc:author", "3p1", "h1"), func(r *rig) {
			r.git.workflows[0].Secrets = []string{"TOKEN"}
		}, "ci", "success", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t)
				r.git.setWorkflows(ciWorkflow("ci", "make"))
				tc.setup(r)
				r.in.set(tc.ev)
				stop := serveRig(t, r.d)
				synctest.Wait()
				stop()
				c := r.final(tc.ev, tc.workflow)
				if c.Status != tc.status || !strings.Contains(c.Error, tc.errHas) {
					t.Errorf("check %s: status %q, error %q; want %q with %q", tc.workflow, c.Status, c.Error, tc.status, tc.errHas)
				}
				if _, done := saved(t, r.d).Done[tc.ev.Key()]; !done {
					t.Error("the event is not done")
				}
			})
		})
	}
}

// A newer push to the same ref, seen while the older one runs, cancels
// it: its check says so, and the newer one runs.
func TestServeSupersedesARunningPush(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		never := make(chan struct{})
		first := push("3k1", "c1")
		r.exec.Script = func(runID, _ string) fakeexec.Step {
			if s := r.exec.Session(runID); s != nil && s.Spec().Annotations["knotless.dev/event"] == string(first.URI) {
				return fakeexec.Step{Gate: never}
			}
			return fakeexec.Step{}
		}
		r.git.setWorkflows(ciWorkflow("ci", "make"))
		r.in.set(first)
		stop := serveRig(t, r.d)
		synctest.Wait()
		if got := r.statuses(first, "ci"); !cmp.Equal(got, []string{"queued", "running"}) {
			t.Fatalf("first push: %v", got)
		}
		second := push("3k2", "c2")
		r.in.set(first, second)
		r.d.Wake()
		synctest.Wait()
		stop()
		if c := r.final(first, "ci"); c.Status != "cancelled" || c.Error != "superseded by "+string(second.URI) {
			t.Errorf("first push: status %q, error %q", c.Status, c.Error)
		}
		if c := r.final(second, "ci"); c.Status != "success" {
			t.Errorf("second push: %q", c.Status)
		}
	})
}

// A pull's author has at most Caps.QueuedPerAuthor runs in hand: the
// next waits, without a check, and goes when one ends.
func TestServeAuthorCap(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.d.cfg.Caps.QueuedPerAuthor = 1
		gate := make(chan struct{})
		r.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		r.git.setWorkflows(ciWorkflow("ci", "make"))
		a, b := pull("did:plc:author", "3p1", "h1"), pull("did:plc:author", "3p2", "h2")
		r.in.set(a, b)
		stop := serveRig(t, r.d)
		synctest.Wait()
		if got := r.statuses(b, "ci"); len(got) != 0 {
			t.Errorf("the pull over its author's cap has checks %v", got)
		}
		close(gate)
		synctest.Wait()
		stop()
		for _, ev := range []ingest.Event{a, b} {
			if c := r.final(ev, "ci"); c.Status != "success" {
				t.Errorf("%s: %q", ev.URI, c.Status)
			}
		}
	})
}

// At SIGTERM a run going on an executor that resumes sessions is handed
// over: state.json keeps it, with its log; the successor adopts it and
// writes its one final check.
func TestServeHandsOverAndAdopts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		gate := make(chan struct{})
		r.exec.Script = func(_, id string) fakeexec.Step {
			if id == "1" {
				return fakeexec.Step{Output: "before the handover\n", Gate: gate}
			}
			return fakeexec.Step{Output: "after\n"}
		}
		r.git.setWorkflows(ciWorkflow("ci", "make", "make test"))
		ev := push("3k1", "c1")
		r.in.set(ev)
		stop := serveRig(t, r.d)
		synctest.Wait()
		stop()
		if got := r.statuses(ev, "ci"); !cmp.Equal(got, []string{"queued", "running"}) {
			t.Fatalf("before the handover: %v", got)
		}
		st := saved(t, r.d)
		key := forge.CheckKey(ev.Subject(), "ci")
		handed, ok := st.Runs[key]
		if !ok || handed.Handover == nil {
			t.Fatalf("state.json runs %+v: want the run handed over", st.Runs)
		}
		if _, err := os.Stat(filepath.Join(r.d.runDir(handed.RunID), handoverLog)); err != nil {
			t.Errorf("the handed-over run's log: %v", err)
		}

		next := r.successor(t)
		next.adopted = next.adoptable(t.Context())
		if len(next.adopted) != 1 {
			t.Fatalf("adoptable: %d runs, want 1", len(next.adopted))
		}
		if err := next.sweep(t.Context(), next.adopted); err != nil {
			t.Fatal(err)
		}
		if swept := r.exec.Swept(); !cmp.Equal(swept[len(swept)-1], []string{handed.RunID}) {
			t.Errorf("sweep kept %v, want the adopted run", swept)
		}
		close(gate)
		stop = serveRig(t, next)
		synctest.Wait()
		stop()
		if got := r.statuses(ev, "ci"); !cmp.Equal(got, []string{"queued", "running", "success"}) {
			t.Errorf("after adoption: %v", got)
		}
		if len(saved(t, next).Runs) != 0 {
			t.Error("the adopted run is still in state.json")
		}
	})
}

// A handed-over run whose workflow is gone cannot be adopted: it is
// forgotten and swept, and its work runs again.
func TestAdoptableDropsWhatCannotGoOn(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		gate := make(chan struct{})
		r.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: gate} }
		r.git.setWorkflows(ciWorkflow("ci", "make"))
		ev := push("3k1", "c1")
		r.in.set(ev)
		stop := serveRig(t, r.d)
		synctest.Wait()
		stop()

		r.git.setWorkflows(ciWorkflow("other", "make"))
		next := r.successor(t)
		next.adopted = next.adoptable(t.Context())
		if len(next.adopted) != 0 {
			t.Fatalf("adopted %d runs of a workflow that is gone", len(next.adopted))
		}
		if err := next.sweep(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
		if len(saved(t, next).Runs) != 0 {
			t.Error("the run that cannot go on is still in state.json")
		}
		if running := r.exec.Running(); len(running) != 0 {
			t.Errorf("sessions left after the sweep: %v", running)
		}
		close(gate)
	})
}

// At SIGTERM on an executor that cannot resume, a run still going at
// the stop wait is cancelled and its check released (queued again).
func TestServeReleasesAtStopWait(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.d.detach = nil
		r.d.cfg.StopWait = time.Minute
		never := make(chan struct{})
		r.exec.Script = func(string, string) fakeexec.Step { return fakeexec.Step{Gate: never} }
		r.git.setWorkflows(ciWorkflow("ci", "make"))
		ev := push("3k1", "c1")
		r.in.set(ev)
		stop := serveRig(t, r.d)
		synctest.Wait()
		stop()
		if got := r.statuses(ev, "ci"); !cmp.Equal(got, []string{"queued", "running", "queued"}) {
			t.Errorf("statuses %v, want released to queued", got)
		}
		if c := r.final(ev, "ci"); !strings.Contains(c.Error, "released by a stopping runner") {
			t.Errorf("released check's error %q", c.Error)
		}
		if _, done := saved(t, r.d).Done[ev.Key()]; done {
			t.Error("released work is done")
		}
	})
}

// A final check the PDS does not take is owed and paid by the serving
// daemon once the PDS takes writes again.
func TestServePaysOwedChecks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.git.setWorkflows(ciWorkflow("ci", "make"))
		ev := push("3k1", "c1")
		r.in.set(ev)
		r.pds.fail = []error{nil, nil, errDown, errDown}
		stop := serveRig(t, r.d)
		synctest.Wait()
		key := forge.CheckKey(ev.Subject(), "ci")
		if _, owed := saved(t, r.d).Owed[key]; !owed {
			t.Fatalf("the final check is not owed: writes %v, state %+v", r.pds.writes(), saved(t, r.d).Owed)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		st := saved(t, r.d)
		if _, owed := st.Owed[key]; owed {
			t.Error("still owed")
		}
		if got := r.statuses(ev, "ci"); !cmp.Equal(got, []string{"queued", "running", "success"}) {
			t.Errorf("statuses %v", got)
		}
	})
}

// A record the lexicon refuses before the write is replaced by a
// minimal error check: never owed, never retried.
func TestLexiconRefusalIsNotOwed(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	cat, err := forge.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	_, invalid := cat.Encode(forge.CollectionCheck, forge.Check{Status: "bogus"})
	if !errors.Is(invalid, forge.ErrInvalid) {
		t.Fatalf("encode: %v", invalid)
	}
	r.pds.fail = []error{invalid}
	ev := push("3k1", "c1")
	r.d.finalError(t.Context(), ev, "ci", "no")
	if len(r.d.st.Owed) != 0 {
		t.Error("a check the lexicon refused is owed")
	}
	if c := r.final(ev, "ci"); c.Status != "error" || !strings.Contains(c.Error, "check record refused") {
		t.Errorf("check %+v, want the minimal error check", c)
	}
}

// The backoff of what is tried again: 2 s doubling to 5 min.
func TestRetryBackoff(t *testing.T) {
	t.Parallel()
	var r Retry
	r.defaults()
	var got []time.Duration
	for tries := 1; tries <= 10; tries++ {
		got = append(got, r.wait(tries))
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second,
		64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute, 5 * time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("waits (-want +got):\n%s", diff)
	}
}

// A sweep that fails at start leaves the daemon degraded: runs get an
// error check naming the cause, STATUS= says so, and the sweep is tried
// again until it works.
func TestWatchExecutorRecovers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.d.faults.swept = false
		r.exec.SetSweepErr(errors.New("API server unreachable"))
		r.d.degrade(r.exec.SweepErr)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { r.d.watchExecutor(ctx); close(done) }()
		synctest.Wait()
		if err := r.d.executorDown(); err == nil || !strings.Contains(err.Error(), "API server unreachable") {
			t.Errorf("executorDown = %v", err)
		}
		r.d.status()
		if !r.notes.has("STATUS=0 running, 0 queued; executor degraded") {
			t.Errorf("status %q", r.notes.msgs)
		}
		r.exec.SetSweepErr(nil)
		time.Sleep(time.Minute)
		synctest.Wait()
		if err := r.d.executorDown(); err != nil {
			t.Errorf("still down after the sweep worked: %v", err)
		}
		cancel()
		<-done
	})
}

// Secrets of a trusted run: the repository's sealed ones opened with the
// runner's key, refused when sealed for another repository, and the
// operator's, which win.
func TestSecretsOfATrustedRun(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	key, err := forge.NewKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	r.d.key = key
	seal := func(name, repo, value string) forge.Record[forge.Secret] {
		b, err := forge.SealSecret(key.Public, forge.Envelope{Repo: repo, Name: name, Runner: rigRunner, Scope: forge.ScopePush, Value: []byte(value)})
		if err != nil {
			t.Fatal(err)
		}
		return forge.Record[forge.Secret]{URI: syntax.ATURI("at://did:plc:owner/dev.knotless.secret/" + name),
			Value: forge.Secret{Repo: testRepo, Name: name, Runner: rigRunner, Scope: forge.ScopePush, Sealed: b}}
	}
	r.d.sealed = &fakeSealed{
		recs: []forge.Record[forge.Secret]{seal("TOKEN", testRepo, "sealed-token"), seal("STOLEN", "at://did:plc:other/dev.knotless.repo/x", "x"),
			seal("SHARED", testRepo, "sealed-shared"), seal("UNGRANTED", testRepo, "u")},
		bad: []forge.Invalid{{URI: "at://did:plc:owner/dev.knotless.secret/bad", Err: errors.New("no")}},
	}
	r.d.cfg.Secrets = []OperatorSecret{{Name: "SHARED", Value: "operator-shared", Repos: []string{testRepo}}}
	wf := ciWorkflow("ci", "make")
	wf.Secrets = []string{"TOKEN", "STOLEN", "SHARED"}
	got, err := r.d.secrets(t.Context(), &job{ev: push("3k1", "c1"), wf: wf})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"TOKEN": "sealed-token", "SHARED": "operator-shared"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("secrets (-want +got):\n%s", diff)
	}
	r.d.sealed = &fakeSealed{err: errDown}
	if _, err := r.d.secrets(t.Context(), &job{ev: push("3k1", "c1"), wf: wf}); err == nil {
		t.Error("a failed listing of sealed secrets gave no error")
	}
}

// The event streams' changes: cursors are kept and saved, a change of
// another account's record wakes the reconciler, the intake is told.
func TestChangesMoveCursors(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.d.changed(ingest.Change{Host: "http://pds.test", Seq: 42, DID: "did:plc:author", Collection: forge.CollectionPull})
	r.d.saveCursors()
	if got := saved(t, r.d).Cursors["http://pds.test"]; got != 42 {
		t.Errorf("cursor %d, want 42", got)
	}
	select {
	case <-r.d.wake:
	default:
		t.Error("a pull record's change did not wake the reconciler")
	}
	if len(r.in.changes) != 1 {
		t.Errorf("intake told of %d changes", len(r.in.changes))
	}
	r.d.cfg.Relay = "http://relay.test"
	if hosts := r.d.eventHosts(); !cmp.Equal(hosts, []string{"http://relay.test"}) {
		t.Errorf("event hosts %v", hosts)
	}
}

// A reconcile that fails is logged and tried again at the next poll; the
// watchdog is fed meanwhile.
func TestServePollsAndFeedsTheWatchdog(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.d.cfg.Watchdog = 10 * time.Second
		r.in.err = errDown
		r.git.setWorkflows(ciWorkflow("ci", "make"))
		ev := push("3k1", "c1")
		r.in.set(ev)
		stop := serveRig(t, r.d)
		synctest.Wait()
		if len(r.pds.writes()) != 0 {
			t.Fatal("checks written without a listing")
		}
		r.in.mu.Lock()
		r.in.err = nil
		r.in.mu.Unlock()
		time.Sleep(r.d.cfg.Poll)
		synctest.Wait()
		stop()
		if c := r.final(ev, "ci"); c.Status != "success" {
			t.Errorf("after the next poll: %q", c.Status)
		}
		if !r.notes.has("WATCHDOG=1") {
			t.Error("the watchdog was not fed")
		}
	})
}
