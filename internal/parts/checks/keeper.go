package checks

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/backoff"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/control"
	"knotless.dev/run/internal/rules/work"
)

// Keeper is the checks part of the daemon: the life of every check the
// runner writes, one method per transition (Queued, Running, Finished,
// Released, Superseded, Error), the mapping of a run's Result onto the
// final check (Map), and the outbox of final checks the PDS has
// not taken (owed.go). It is the only code that sets a check's status:
// the daemon's other parts ask it, and read what it knows (Final,
// Pending, Verdict). Its writes go through the Recorder, which checks
// each move against the transition table. Safe for concurrent use.
type Keeper struct {
	rec    *Recorder
	blobs  Blobs
	outbox Outbox
	until  func() time.Time
	live   Live
	retry  backoff.Policy
	log    *slog.Logger
	waited func(time.Duration) // OnWait; nil: no one is told

	low    func() bool
	blobOf LogBlobs

	mu   sync.Mutex
	next map[string]time.Time // when each owed check is tried next (in memory: a new process tries at once)
	wake chan struct{}        // a hint that a check became owed, or a write was deferred
	// deferred are the non-final writes the PDS's low budget held back,
	// by key: the newest of each check (budget.go).
	deferred map[string]deferredWrite
	seq      uint64
}

// Blobs takes a run's log and image outputs (pdsclient.Account).
type Blobs interface {
	UploadBlob(ctx context.Context, mimeType string, data []byte) (atdata.Blob, error)
}

// Outbox keeps the final checks the PDS has not taken (state.Store).
type Outbox interface {
	Owe(key string, o state.Owed) error
	// Paid forgets an owed check that was written and marks its event
	// done; Forgive forgets one that can never be.
	Paid(key string) error
	Forgive(key string) error
	Owed() map[string]state.Owed
	IsOwed(key string) bool
}

// Live is where checks' output is read while they run, and their files
// after (the live-output part).
type Live interface {
	// Where says where the output of check key is read; nil: nowhere
	// (no stream of it is open).
	Where(key string) *forge.LiveOutput
	// Files are the output files of check key's run kept for download
	// where Where says.
	Files(key string) []forge.RunFile
}

// Ports are what a Keeper uses of the outside.
type Ports struct {
	Blobs  Blobs
	Outbox Outbox
	// LimitedUntil is until when the runner's PDS said it limits this
	// runner (RateLimits.Until of its host); nil: it never said.
	LimitedUntil func() time.Time
	// BudgetLow says whether the runner's PDS said little is left of its
	// record-write budget (RateLimits.Low of its host): the checks'
	// non-final writes then wait; nil: never.
	BudgetLow func() bool
	// LogBlobs is which runs' logs the final check carries (the
	// operator's --log-blobs); empty: every run's.
	LogBlobs LogBlobs
	// Live, when set, says where the running check's output is read
	// (its live field) and which files the final check lists.
	Live Live
}

// NewKeeper returns the checks part writing through rec; retry paces
// the owed checks' writes.
func NewKeeper(rec *Recorder, p Ports, retry backoff.Policy, log *slog.Logger) *Keeper {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	until := p.LimitedUntil
	if until == nil {
		until = func() time.Time { return time.Time{} }
	}
	low := p.BudgetLow
	if low == nil {
		low = func() bool { return false }
	}
	return &Keeper{rec: rec, blobs: p.Blobs, outbox: p.Outbox, until: until, live: p.Live, retry: retry, log: log,
		low: low, blobOf: p.LogBlobs,
		next: map[string]time.Time{}, wake: make(chan struct{}, 1), deferred: map[string]deferredWrite{}}
}

// Know remembers a check listed from the PDS, without writing it.
func (k *Keeper) Know(key string, c forge.Check) { k.rec.Know(key, c) }

// Going reports whether the check of key, as last written or read,
// says its run is going (running).
func (k *Keeper) Going(key string) bool {
	c, ok := k.rec.Get(key)
	return ok && Status(c.Status) == Running
}

// Refresh reads the check of key from the PDS unless it is known final
// (Recorder.Refresh): with replicas, another process of the runner may
// have written it.
func (k *Keeper) Refresh(ctx context.Context, key string) error { return k.rec.Refresh(ctx, key) }

// KnowCID remembers the CID a listed check's record has: its next write
// is a compare-and-swap from it (Recorder.KnowCID).
func (k *Keeper) KnowCID(key, cid string) { k.rec.KnowCID(key, cid) }

// Expect and ExpectWrite: Recorder.Expect and Recorder.ExpectWrite.
func (k *Keeper) Expect(ctx context.Context) (context.Context, func()) { return k.rec.Expect(ctx) }
func (k *Keeper) ExpectWrite(key string) func()                        { return k.rec.ExpectWrite(key) }

// Get returns the last check of key, written or known.
func (k *Keeper) Get(key string) (forge.Check, bool) { return k.rec.Get(key) }

// Final reports whether the check of key is known and final: its work
// never runs again.
func (k *Keeper) Final(key string) bool {
	c, known := k.rec.Get(key)
	return known && Status(c.Status).Final()
}

// Pending reports whether the event has a check that is not final.
func (k *Keeper) Pending(ev work.Event) bool { return k.rec.Pending(ev.URI.String(), ev.Commit) }

// Queued writes the queued check of the workflow wf of ev (key): the
// work is in the queue, behind others, and, when waits is not "", says
// what else it waits for (the runs it needs). A check queued already is
// not written again; one an earlier process left keeps its creation
// time.
func (k *Keeper) Queued(ctx context.Context, key string, ev work.Event, wf string, behind int, waits string) (forge.Check, error) {
	c := forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: wf, Status: string(Queued), CreatedAt: forge.Now(),
		Attempt: ev.Attempt(wf), Cause: ev.Cause, QueuedBehind: int64(behind), Error: Truncate(waits, MaxError)}
	prev, known := k.rec.Get(key)
	if known {
		c.CreatedAt = prev.CreatedAt
	}
	if !known || prev.Status != string(Queued) {
		if err := k.nonFinal(ctx, Queue, key, c, k.log); err != nil {
			return c, err
		}
	}
	return c, nil
}

// Unqueued is the check of the workflow wf of ev (key) for work a
// worker starts at once: nothing is written now, and Running writes it
// as the check's first record (no queued record: a write and its points
// saved). ok is false when the check has a record a start cannot follow
// (an earlier process left it running): the work is queued first
// (Queued).
func (k *Keeper) Unqueued(key string, ev work.Event, wf string) (c forge.Check, ok bool) {
	c = forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: wf, CreatedAt: forge.Now(),
		Attempt: ev.Attempt(wf), Cause: ev.Cause}
	prev, known := k.rec.Get(key)
	if !known {
		return c, true
	}
	c.CreatedAt, c.Status = prev.CreatedAt, prev.Status
	return c, Allowed(Start, Status(prev.Status), Running) == nil
}

// Running writes the running check of c's work, started at started,
// and returns it: c's first record when the work was not queued
// (Unqueued). A failed write is logged: the run goes on.
func (k *Keeper) Running(ctx context.Context, key string, c forge.Check, started time.Time, log *slog.Logger) forge.Check {
	c.Status, c.StartedAt = string(Running), forge.Datetime(started)
	if k.live != nil {
		c.Live = k.live.Where(key)
	}
	if err := k.nonFinal(ctx, Start, key, c, log); err != nil {
		log.Error("write running check", "err", err)
	}
	return c
}

// End is how some work ended, as the one who ran it tells: the check
// of Key (of Event, as last written: Check), the run's Result with its
// outputs under OutDir (no Result: the work never ran, a queued job),
// and, for a cancel, By: the newer event that superseded it or the
// cancel record that stopped it. Log tells what goes wrong writing it.
type End struct {
	Key    string
	Event  work.Event
	Check  forge.Check
	By     string
	Result *run.Result
	OutDir string
	Log    *slog.Logger
}

// Finished writes the final check of a run that ended: its Result
// (Map), the log and the image outputs under OutDir uploaded. A check
// the PDS does not take now is owed. It returns the check.
func (k *Keeper) Finished(ctx context.Context, e End) forge.Check {
	final := k.Map(ctx, e.Check, e.Result, e.OutDir, e.Log)
	final.Files = k.files(e.Key)
	k.putFinal(ctx, Finish, e.Key, e.Event, final, e.Log)
	return final
}

// Superseded writes the cancelled check of work a newer event (e.By)
// superseded: a queued job's (no Result), or a running one's result.
func (k *Keeper) Superseded(ctx context.Context, e End) forge.Check {
	return k.cancelled(ctx, Supersede, e, "superseded by "+e.By)
}

// Cancelled writes the cancelled check of work the cancel record e.By
// (an AT-URI) stopped: a queued job's (no Result), or a running one's
// result. It names the record (CancelledBy) and says so
// (control.CancelledText). A check that is final already stays as it
// is: the move is refused (a cancel never changes a result).
func (k *Keeper) Cancelled(ctx context.Context, e End) forge.Check {
	e.Check.CancelledBy = e.By
	return k.cancelled(ctx, Finish, e, control.CancelledText(e.By))
}

func (k *Keeper) cancelled(ctx context.Context, t Transition, e End, why string) forge.Check {
	c := e.Check
	if e.Result == nil {
		c.Status, c.FinishedAt = string(Cancelled), forge.Now()
	} else {
		c = k.Map(ctx, c, e.Result, e.OutDir, e.Log)
		c.Files = k.files(e.Key)
	}
	c.Error = why
	k.putFinal(ctx, t, e.Key, e.Event, c, e.Log)
	return c
}

// Released writes a run a stopping runner gave back: its check queued
// again, not final, for the successor (nothing is owed).
func (k *Keeper) Released(ctx context.Context, e End) {
	if prev, _ := k.rec.Get(e.Key); Status(prev.Status) == None {
		// Nothing was written of it (its running record waits for the
		// PDS's budget): nothing to give back.
		k.forgetDeferred(e.Key)
		return
	}
	c := k.Map(ctx, e.Check, e.Result, e.OutDir, e.Log)
	c.Status, c.Error = string(Queued), "released by a stopping runner: runs again on its successor"
	c.FinishedAt, c.Files = "", nil
	if err := k.nonFinal(ctx, Release, e.Key, c, e.Log); err != nil {
		e.Log.Error("write released check", "err", err)
	}
}

// Requeued writes the check of key, which says running, queued again:
// with replicas, its driver died before the run's first step and a
// survivor claimed the run, which starts again (why says so). The
// record is written now or not at all (never held back for the PDS's
// budget): the run's Job goes only once it is. It is read from the PDS
// first; a check not running is left as it is.
func (k *Keeper) Requeued(ctx context.Context, key, why string) error {
	// As the PDS has it now: this process may not have read it yet.
	if err := k.rec.Refresh(ctx, key); err != nil {
		return err
	}
	c, known := k.rec.Get(key)
	if !known || Status(c.Status) != Running {
		return nil
	}
	c.Status, c.Error, c.StartedAt, c.Live = string(Queued), Truncate(why, MaxError), "", nil
	return k.rec.WriteFrom(ctx, Release, key, Running, c)
}

// Error writes the final error check of the workflow wf of ev, which
// cannot run (an invalid file, a refused event, a commit that does not
// fetch, a pull that does not merge), unless its check is final.
func (k *Keeper) Error(ctx context.Context, ev work.Event, wf, msg string) {
	key := ev.CheckKey(wf)
	if k.Final(key) {
		return
	}
	now := forge.Now()
	c := forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: wf, Status: string(Error),
		Error: Truncate(msg, MaxError), CreatedAt: now, FinishedAt: now, Attempt: ev.Attempt(wf), Cause: ev.Cause}
	k.putFinal(ctx, Finish, key, ev, c, k.log)
}

// Skipped writes the final skipped check of the workflow wf of ev,
// which its path filters leave out or whose needs did not succeed (why
// says which), unless its check is final.
func (k *Keeper) Skipped(ctx context.Context, ev work.Event, wf, why string) {
	key := ev.CheckKey(wf)
	if k.Final(key) {
		return
	}
	now := forge.Now()
	c := forge.Check{Type: forge.CollectionCheck, Subject: ev.Subject(), Workflow: wf, Status: string(Skipped),
		Error: Truncate(why, MaxError), CreatedAt: now, FinishedAt: now, Attempt: ev.Attempt(wf), Cause: ev.Cause}
	k.putFinal(ctx, Finish, key, ev, c, k.log)
}

// Map maps a run's result onto its check c, one to one: status, times,
// failed step, error, steps with their exit codes and durations, the
// log and the image outputs (read from outDir, where the run's outputs
// are) uploaded as blobs. A blob that does not upload is logged and
// left out.
func (k *Keeper) Map(ctx context.Context, c forge.Check, res *run.Result, outDir string, log *slog.Logger) forge.Check {
	c.Status = string(res.Status)
	c.StartedAt = forge.Datetime(res.StartedAt)
	c.FinishedAt = forge.Datetime(res.FinishedAt)
	c.FailedStep = Truncate(res.FailedStep, MaxName)
	c.Error = Truncate(res.Error, MaxError)
	c.Tries = 0
	if res.Tries > 1 {
		c.Tries = int64(res.Tries)
	}
	c.Steps = nil
	for _, s := range res.Steps {
		cs := forge.CheckStep{Name: Truncate(s.Name, MaxName), Status: string(s.Status), DurationMs: s.Duration.Milliseconds(), TimedOut: s.TimedOut}
		if s.ExitCode != nil {
			code := int64(*s.ExitCode)
			cs.ExitCode = &code
		}
		c.Steps = append(c.Steps, cs)
	}
	if len(res.Log) > 0 && k.blobOf.keeps(res.Status) {
		blob, err := k.blobs.UploadBlob(ctx, "text/plain", res.Log)
		if err != nil {
			log.Error("upload run log", "err", err)
		} else {
			c.Log = &blob
		}
	}
	// Only what the workflow's artifacts name is published: an image is
	// a public blob, and no masker reads pixels.
	for _, rel := range res.Artifacts {
		if len(c.Outputs) == maxOutputs {
			log.Warn("more image outputs than a check holds; the rest are not uploaded", "max", maxOutputs)
			break
		}
		data, mimeType, ok := readImage(filepath.Join(outDir, filepath.FromSlash(rel)))
		if !ok {
			continue
		}
		blob, err := k.blobs.UploadBlob(ctx, mimeType, data)
		if err != nil {
			log.Error("upload output", "path", rel, "err", err)
			continue
		}
		c.Outputs = append(c.Outputs, forge.Output{Path: rel, Blob: blob})
	}
	return c
}

// files are the output files of key's run live output keeps (Ports.Live).
func (k *Keeper) files(key string) []forge.RunFile {
	if k.live == nil {
		return nil
	}
	return k.live.Files(key)
}

// putFinal writes a final check through the recorder (Recorder.Final):
// one the PDS does not take now is owed.
func (k *Keeper) putFinal(ctx context.Context, t Transition, key string, ev work.Event, c forge.Check, log *slog.Logger) {
	k.forgetDeferred(key)
	c, err := k.rec.Final(ctx, t, key, c, log)
	var owed *OwedError
	switch {
	case errors.As(err, &owed):
		k.owe(key, ev, c, owed.Err, log)
	case err != nil:
		log.Error("final check not written", "check", key, "err", err)
	}
}

// Verdict is what the checks of some work say together.
type Verdict int

// The verdicts, from best to worst.
const (
	Passed  Verdict = iota // every check succeeded (or was skipped)
	Waiting                // some check is not final yet
	Unknown                // some check is not written yet
	Failed                 // a check did not succeed
)

// Verdict reads the checks of the workflows of subject: all succeeded
// (a skipped check, which its path filters left out, counts as
// passing: a required workflow filtered out does not hold the queue),
// one failed (detail names it), or not there yet.
func (k *Keeper) Verdict(subject forge.Subject, workflows []string) (Verdict, string) {
	v := Passed
	for _, wf := range workflows {
		c, known := k.rec.Get(forge.CheckKey(subject, wf))
		switch {
		case !known:
			v = max(v, Unknown)
		case !Status(c.Status).Final():
			v = max(v, Waiting)
		case Status(c.Status) != Success && Status(c.Status) != Skipped:
			detail := "workflow " + wf + ": " + c.Status
			if c.FailedStep != "" {
				detail += " in step " + c.FailedStep
			}
			return Failed, detail
		}
	}
	return v, ""
}

// Forget drops the final checks (in memory) finished before cutoff,
// but those of the events need keeps (listed and still work, whose
// memory stops them running again) and the owed ones; it returns how
// many went.
func (k *Keeper) Forget(cutoff time.Time, need func(evKey string) bool) int {
	return k.rec.Forget(func(key string, c forge.Check) bool {
		if !Status(c.Status).Final() || need(c.Subject.Event+"@"+c.Subject.Commit) {
			return false
		}
		if k.outbox.IsOwed(key) {
			return false
		}
		at := c.FinishedAt
		if at == "" {
			at = c.CreatedAt
		}
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(at))
		return err == nil && t.Before(cutoff)
	})
}
