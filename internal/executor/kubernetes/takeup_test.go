package kubernetes_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/tests/clustertest"
)

// TestTakeUpAfterDeath: a runner process dies (as with kill -9: its
// streams drop, nothing is acknowledged, no handover is written) and a
// new one takes the run up from its newest checkpoint and the pod's step
// ledger: the step that was going is followed from its first byte and
// never started again, and the log goes on byte for byte as the dead
// process wrote it. A witness in the pod counts the step's starts.
func TestTakeUpAfterDeath(t *testing.T) {
	t.Parallel()
	wf := parse(t, `on: push
steps:
  - name: long
    run: |
      echo start >> "$KNOTLESS_RUN_WORK/starts"
      echo before
      sleep 8
      echo after
  - name: next
    run: echo "starts $(wc -l < "$KNOTLESS_RUN_WORK/starts")"
`)
	for _, tc := range []struct {
		name string
		// during: the process dies while step 1 runs; else just after
		// it ended and its output was read, before the next checkpoint.
		during bool
		logHas string
	}{
		{"while the step runs", true, "knotless-run: step 1/2 was taken over by a new runner process after the one following it died; its output above was read again from the session\n"},
		{"once the step's output was read", false, "knotless-run: the output of step long went with the runner process that read it; its exit code 0 is from the session's ledger\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := clustertest.Start(t) // a namespace of its own: assertNothingLeft looks at all of it
			runner := "did:plc:" + randomID("takeup")
			sameRunner := func(cfg *kubernetes.Config) { cfg.Runner = runner }
			var mu sync.Mutex
			var cps []run.Handover
			var logs [][]byte
			dead := make(chan struct{})
			buried := make(chan struct{})
			t.Cleanup(func() { close(buried) })
			req := run.Request{RunID: randomID("takeup"), Workflow: wf, Checkout: t.TempDir(), Trusted: true,
				Checkpoint: func(h run.Handover, log []byte) error {
					mu.Lock()
					cps, logs = append(cps, h), append(logs, append([]byte(nil), log...))
					n := len(cps)
					mu.Unlock()
					if !tc.during && n == 2 {
						// Step 1 ended and was read; the process dies
						// before this checkpoint is on disk.
						close(dead)
						<-buried
						return errors.New("dead")
					}
					return nil
				}}
			first := newExecutor(t, c, sameRunner)
			var firstLog []byte
			if tc.during {
				res := detachMidStep(t, first, c.Image, req) // streams dropped, nothing acknowledged
				firstLog = res.Log
			} else {
				go engine(first, c.Image).Run(context.Background(), req)
				<-dead
			}
			mu.Lock()
			h, prior := cps[0], logs[0]
			mu.Unlock()
			if !h.Replay || h.Step != 0 {
				t.Fatalf("checkpoint: step %d, replay %t", h.Step, h.Replay)
			}

			next := newExecutor(t, c, sameRunner)
			if swept, err := next.Sweep(context.Background(), []string{req.RunID}); err != nil || len(swept) != 0 {
				t.Fatalf("sweep keeping the run: swept %v, %v", swept, err)
			}
			adoptReq := req
			adoptReq.Checkpoint = nil
			adopted := engine(next, c.Image).Adopt(context.Background(), adoptReq, h, prior)
			if adopted.Status != run.Success {
				t.Fatalf("taken up: status %s (%s)\nlog:\n%s", adopted.Status, adopted.Error, adopted.Log)
			}
			log := string(adopted.Log)
			if !strings.Contains(log, "\nstarts 1\n") {
				t.Errorf("the witness did not count one start of step 1:\n%s", log)
			}
			if !strings.Contains(log, tc.logHas) {
				t.Errorf("the log lacks %q:\n%s", tc.logHas, log)
			}
			if !strings.HasPrefix(log, string(prior)) {
				t.Errorf("the log does not go on from the checkpoint's:\n%s", log)
			}
			if tc.during {
				// What the dead process had logged, up to its last line
				// about stopping, is where the new log goes on from.
				upTo := string(firstLog)
				if i := strings.Index(upTo, "knotless-run: runner stopping"); i >= 0 {
					upTo = upTo[:i]
				}
				if !strings.HasPrefix(log, upTo) {
					t.Errorf("a follower of the dead process would see other bytes:\ndead:\n%s\nnew:\n%s", upTo, log)
				}
				for _, line := range []string{"before", "after", "==> step 1/2: long"} {
					if n := countLines(log, line); n != 1 {
						t.Errorf("line %q %d times in the log, want once:\n%s", line, n, log)
					}
				}
			}
			assertNothingLeft(t, c)
		})
	}
}
