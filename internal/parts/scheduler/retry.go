package scheduler

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"

	"knotless.dev/run/internal/engine/caplog"
	"knotless.dev/run/internal/engine/run"
)

// TryKey is what the run id of try (1 for the first) of the work of a
// check key is made from: the key itself for the first, so a first try
// is named as a run always was; the key and the try for a retry, so its
// session is a new object beside the lost one, fenced as its own run.
func TryKey(key string, try int) string {
	if try <= 1 {
		return key
	}
	return key + "\n" + strconv.Itoa(try)
}

// tries runs t's work (execute) and, while its workflow's retry says so,
// runs it again, each try its own run: its own id (TryKey), session and
// run directory, the last try's left for the caller (returned with its
// directory). The check is the work's, one for all tries: the running
// record is written once, the final one says how many tries ran
// (Result.Tries), and its log holds every try's, each retry's beginning
// with the line that says why. Only a run this process started is tried
// again; a cancelled, superseded, released, fenced or handed-over one
// never is, nor any while the daemon stops.
func (s *Scheduler) tries(ctx context.Context, t *task, dir string, log *slog.Logger) (*run.Result, string) {
	res := s.execute(ctx, t, dir, log)
	retry := t.Workflow.Retry
	if t.adopt != nil || retry == nil {
		return res, dir
	}
	// The tries' logs, capped as one run's (a retried run's whose log
	// was cut keeps its head and tail, the marker between).
	earlier := caplog.New(caplog.DefaultMax)
	var earlierSize int64
	try := 1
	for {
		failed := res.Status == run.Failure || res.Status == run.Error
		s.mu.Lock()
		stopped := t.superseded != "" || t.cancelled != "" || t.released
		s.mu.Unlock()
		if stopped || res.Fenced || ctx.Err() != nil || s.stopping() || !retry.Again(try, failed, res.Lost) {
			break
		}
		reason, why := "failure", fmt.Sprintf("ended %s", res.Status)
		if res.Lost {
			reason, why = "infrastructure", "was lost to the infrastructure"
		}
		if res.Error != "" {
			why += ": " + res.Error
		}
		line := fmt.Sprintf("knotless-run: attempt %d of %d: attempt %d %s\n", try+1, retry.Max+1, try, why)
		log.Warn("run tried again", "run", t.runID, "attempt", try+1, "of", retry.Max+1, "reason", reason, "err", res.Error)
		if s.p.Observer != nil {
			s.p.Observer.Retried(t.Job, reason)
		}
		if t.live != nil {
			_, _ = io.WriteString(t.live, line)
		}
		_, _ = earlier.Write(res.Log)
		_, _ = io.WriteString(earlier, line)
		earlierSize += res.LogSize + int64(len(line))
		// The lost try's directory goes; its session is stopped by its end.
		_ = os.RemoveAll(dir)
		try++
		s.mu.Lock()
		t.try, t.runID = try, run.IDFor(s.facts.Runner.String(), TryKey(t.Key, try))
		s.mu.Unlock()
		dir = s.runDir(t.runID)
		_ = os.RemoveAll(dir)
		res = s.execute(ctx, t, dir, log)
	}
	if try > 1 {
		_, _ = earlier.Write(res.Log)
		res.Log = earlier.Bytes()
		res.LogSize += earlierSize
		res.Tries = try
		if res.Handover != nil {
			// The successor's stream goes on after every try's bytes.
			res.Handover.LogSize += earlierSize
		}
	}
	return res, dir
}
