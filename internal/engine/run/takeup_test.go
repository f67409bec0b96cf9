package run_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/rules/workflow"
)

// A run taken up after the process running it died (kill -9): the
// adopter goes on from the newest checkpoint, asks the session's ledger
// whether the step after it started, never starts a step twice, and its
// log goes on byte for byte as the dead process wrote it.

func threeSteps() *workflow.Workflow {
	return &workflow.Workflow{Name: "ci", Steps: []workflow.Step{{Name: "build", Run: "make"}, {Name: "deploy", Run: "make deploy"}, {Name: "notify", Run: "true"}}}
}

// checkpoint is one Request.Checkpoint call.
type checkpoint struct {
	h   run.Handover
	log []byte
}

// checkpoints keeps the checkpoints of a run. The one numbered dieAt
// (from 1) is where the process dies: the call is kept, then blocks
// until release closes and fails, so the run never goes past it.
type checkpoints struct {
	dieAt   int
	died    chan struct{}
	release chan struct{}

	mu   sync.Mutex
	list []checkpoint
}

func newCheckpoints(dieAt int) *checkpoints {
	return &checkpoints{dieAt: dieAt, died: make(chan struct{}), release: make(chan struct{})}
}

func (c *checkpoints) record(h run.Handover, log []byte) error {
	c.mu.Lock()
	c.list = append(c.list, checkpoint{h, append([]byte(nil), log...)})
	n := len(c.list)
	c.mu.Unlock()
	if n == c.dieAt {
		close(c.died)
		<-c.release
		return errors.New("the process died")
	}
	return nil
}

func (c *checkpoints) get(n int) checkpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.list[n-1]
}

// durations are the steps' footers' durations: they differ run to run.
var durations = regexp.MustCompile(`, exit (\S+), [0-9.]+[µmn]?s\n`)

func sameLog(s string) string { return durations.ReplaceAllString(s, ", exit $1, D\n") }

func TestTakeUpAfterDeath(t *testing.T) {
	t.Parallel()
	script := func(code int, gate <-chan struct{}) func(_, id string) fakeexec.Step {
		return func(_, id string) fakeexec.Step {
			st := fakeexec.Step{Output: "out of step " + id + "\n"}
			if id == "2" {
				st.Code, st.Gate = code, gate
			}
			return st
		}
	}
	for _, tc := range []struct {
		name string
		// dieAt is the checkpoint the first process dies at (0: it
		// runs to its end); from the one the adopter goes on from.
		dieAt, from int
		code        int  // step 2's exit code
		gated       bool // step 2 waits: the first process dies while it runs
		drop        bool // the session let go of step 2's output (read to its end)
		status      run.Status
		steps       []string
		logHas      string
	}{
		{name: "died before the step started", dieAt: 2, from: 2, status: run.Success,
			steps:  []string{"build=success", "deploy=success", "notify=success"},
			logHas: "knotless-run: step 2/3 was started by a new runner process after the one running the run died before it\n"},
		{name: "died while the step ran", from: 2, gated: true, status: run.Success,
			steps:  []string{"build=success", "deploy=success", "notify=success"},
			logHas: "knotless-run: step 2/3 was taken over by a new runner process after the one following it died; its output above was read again from the session\n"},
		{name: "died once the step's output was read", dieAt: 3, from: 2, drop: true, status: run.Success,
			steps:  []string{"build=success", "deploy=success", "notify=success"},
			logHas: "knotless-run: the output of step deploy went with the runner process that read it; its exit code 0 is from the session's ledger\n"},
		{name: "a failed step's code from the ledger", from: 2, drop: true, code: 3, status: run.Failure,
			steps:  []string{"build=success", "deploy=failure", "notify=skipped"},
			logHas: "its exit code 3 is from the session's ledger"},
		{name: "died after the last step", from: 4, status: run.Success,
			steps:  []string{"build=success", "deploy=success", "notify=success"},
			logHas: "knotless-run: taken over after its last step by a new runner process after the one running it died\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			gate := make(chan struct{})
			if !tc.gated {
				close(gate)
			}
			// StopErr: the session outlives the dead process's clean-up,
			// as a Job outlives a runner killed with SIGKILL.
			ex := &fakeexec.Executor{Script: script(tc.code, gate), StopErr: errors.New("the process is dead")}
			cps := newCheckpoints(tc.dieAt)
			req := run.Request{RunID: "r1", Workflow: threeSteps(), Checkout: checkout(t, map[string]string{"a": "b"}), Checkpoint: cps.record}

			ctx, die := context.WithCancel(t.Context())
			defer die()
			first := make(chan *run.Result, 1)
			go func() { first <- run.New(run.Config{Executor: ex}).Run(ctx, req) }()
			switch {
			case tc.dieAt > 0:
				<-cps.died
			case tc.gated:
				// The first process follows step 2 when it dies.
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
					if s := ex.Session("r1"); s != nil {
						if _, ok := s.Payload("2"); ok {
							break
						}
					}
					if time.Now().After(deadline) {
						t.Fatal("step 2 did not start")
					}
				}
				die()
				<-first
			default:
				if res := <-first; res.Status != run.Status(map[bool]string{true: "success", false: "failure"}[tc.code == 0]) {
					t.Fatalf("the first run: %s (%s)", res.Status, res.Error)
				}
			}
			if tc.drop {
				ex.Session("r1").Drop("2")
			}

			cp := cps.get(tc.from)
			if !cp.h.Replay || cp.h.Step != tc.from-1 || cp.h.LogSize != int64(len(cp.log)) {
				t.Fatalf("checkpoint %d: step %d, replay %t, log size %d of %d bytes", tc.from, cp.h.Step, cp.h.Replay, cp.h.LogSize, len(cp.log))
			}
			var live strings.Builder
			adoptReq := req
			adoptReq.Checkpoint = nil
			adoptReq.Live = &live
			var res *run.Result
			done := make(chan struct{})
			go func() {
				defer close(done)
				res = run.New(run.Config{Executor: ex}).Adopt(t.Context(), adoptReq, cp.h, cp.log)
			}()
			if tc.gated {
				close(gate)
			}
			<-done
			close(cps.release)

			if res.Status != tc.status {
				t.Fatalf("adopted run: %s (%s)\n%s", res.Status, res.Error, res.Log)
			}
			if diff := cmp.Diff(tc.steps, statuses(res)); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			log := string(res.Log)
			if !strings.Contains(log, tc.logHas) {
				t.Errorf("log lacks %q:\n%s", tc.logHas, log)
			}
			if !strings.HasPrefix(log, string(cp.log)) || live.String() != log[len(cp.log):] {
				t.Errorf("the log does not go on from the checkpoint's, or the live stream is not its rest:\ncheckpoint:\n%s\nlog:\n%s\nlive:\n%s", cp.log, log, live.String())
			}
			if n := strings.Count(log, "==> step 2/3: deploy\n"); n != 1 {
				t.Errorf("step 2's header %d times, want once:\n%s", n, log)
			}
			// Every step's output once, in order; none started twice
			// (the fake session refuses a second start of a step).
			want := []string{"out of step 1\n", "out of step 2\n", "out of step 3\n"}
			if tc.drop {
				want = want[:1]
			}
			if tc.status == run.Success && !tc.drop {
				at := 0
				for _, w := range want {
					i := strings.Index(log[at:], w)
					if i < 0 || strings.Count(log, w) != 1 {
						t.Errorf("%q not once, in order, in the log:\n%s", w, log)
						break
					}
					at += i + len(w)
				}
			}

			// What a run that nobody killed logs, the takeover's line
			// aside: the log of the takeover is the same bytes.
			if tc.status == run.Success && !tc.drop {
				clean := &fakeexec.Executor{Script: script(0, nil)}
				plain := run.New(run.Config{Executor: clean}).Run(t.Context(), run.Request{RunID: "r2", Workflow: threeSteps(), Checkout: req.Checkout})
				got := strings.Replace(log, tc.logHas, "", 1)
				got = strings.ReplaceAll(got, "r1", "r2")
				if diff := cmp.Diff(sameLog(string(plain.Log)), sameLog(got)); diff != "" {
					t.Errorf("the taken-up run's log is not a clean run's (-clean +taken up):\n%s", diff)
				}
			}
		})
	}
}

// A checkpoint that cannot be written stops the run before the step it
// was for: a run that could not be taken up must not start a step.
func TestCheckpointFailureStopsTheRun(t *testing.T) {
	t.Parallel()
	ex := &fakeexec.Executor{}
	calls := 0
	res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: "r1", Workflow: threeSteps(), Checkout: checkout(t, nil),
		Checkpoint: func(run.Handover, []byte) error {
			calls++
			if calls == 2 {
				return errors.New("disk full")
			}
			return nil
		}})
	if res.Status != run.Error || !strings.Contains(res.Error, "before step 2/3") || !strings.Contains(res.Error, "disk full") {
		t.Errorf("status %s (%s), want error naming step 2 and the cause", res.Status, res.Error)
	}
	if _, ok := ex.Session("r1").Payload("2"); ok {
		t.Error("step 2 started though where the run stood could not be recorded")
	}
}
