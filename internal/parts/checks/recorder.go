package checks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/keymu"
)

// Writer puts a record in the runner's repository (pdsclient.Account).
type Writer interface {
	Put(ctx context.Context, collection, rkey string, v any) (syntax.ATURI, error)
}

// Recorder writes the runner's check records and remembers the last of
// each, by record key. It is safe for concurrent use; it holds its lock
// only to read and remember, never during a write. The writes of one
// record are made one at a time (a lock per key, held over that
// record's write only), so each is checked against the one before it.
type Recorder struct {
	commit   *groupCommit
	onWrite  func(key string, c forge.Check)
	swapLost func()
	writing  keymu.Map

	mu    sync.Mutex
	known map[string]forge.Check
	// cids are the CIDs the records have on the PDS, as this runner last
	// wrote or read them: what a compare-and-swap expects (Swapper).
	// None for a record known without its CID: read before it is
	// written.
	cids map[string]string
}

// NewRecorder returns a Recorder writing with w; onWrite, when set, is
// told of every record written, after the write. When w is a Batcher
// too, the writes of different records that wait for one another go as
// one commit (groupCommit).
func NewRecorder(w Writer, onWrite func(key string, c forge.Check)) *Recorder {
	return &Recorder{commit: newGroupCommit(w), onWrite: onWrite, known: map[string]forge.Check{}, cids: map[string]string{}}
}

// OnSwapLost sets f to be told of each check write that lost its
// compare-and-swap to another writer (for the metrics).
func (r *Recorder) OnSwapLost(f func()) { r.swapLost = f }

// KnowCID remembers the CID the record of key has on the PDS (as
// listed), for the next write's compare-and-swap.
func (r *Recorder) KnowCID(key, cid string) {
	r.mu.Lock()
	r.cids[key] = cid
	r.mu.Unlock()
}

func (r *Recorder) cid(key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cids[key]
}

// Expect says a check write is about to come, made with the context
// returned: until it is (or done is called, or MaxLinger has passed),
// the writes queued wait for it, to go with it in one commit. done may
// be called more than once, and after the write.
func (r *Recorder) Expect(ctx context.Context) (_ context.Context, done func()) {
	return r.commit.expect(ctx, "")
}

// ExpectWrite is Expect of the next write of the check of key, made with
// any context.
func (r *Recorder) ExpectWrite(key string) (done func()) {
	_, done = r.commit.expect(context.Background(), key)
	return done
}

// Know remembers a check without writing it: one listed from the PDS,
// or one owed by an earlier process.
func (r *Recorder) Know(key string, c forge.Check) {
	r.mu.Lock()
	r.known[key] = c
	r.mu.Unlock()
}

// Get returns the last check of key, written or known.
func (r *Recorder) Get(key string) (forge.Check, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.known[key]
	return c, ok
}

// Pending reports whether the work (event AT-URI and commit) has a check
// that is not final.
func (r *Recorder) Pending(event, commit string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.known {
		if c.Subject.Event == event && c.Subject.Commit == commit && !Status(c.Status).Final() {
			return true
		}
	}
	return false
}

// Forget drops the checks for which drop is true and returns how many
// went.
func (r *Recorder) Forget(drop func(key string, c forge.Check) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for key, c := range r.known {
		if drop(key, c) {
			delete(r.known, key)
			n++
		}
	}
	return n
}

// Write moves the check of key to c by t: it refuses a move the table
// does not allow (Allowed), then writes the record.
func (r *Recorder) Write(ctx context.Context, t Transition, key string, c forge.Check) error {
	defer r.writing.Lock(key)()
	return r.write(ctx, t, key, c)
}

// ErrMoved is a write WriteFrom did not make: the check is no longer at
// the status the write was meant to move it from.
var ErrMoved = errors.New("the check moved on")

// WriteFrom is Write of a move from status from only: when the check of
// key is at another status by the time its turn comes (a later write
// went first), it writes nothing and returns ErrMoved.
func (r *Recorder) WriteFrom(ctx context.Context, t Transition, key string, from Status, c forge.Check) error {
	defer r.writing.Lock(key)()
	if prev, _ := r.Get(key); Status(prev.Status) != from {
		return fmt.Errorf("write check %s (%s): %w", key, c.Status, ErrMoved)
	}
	return r.write(ctx, t, key, c)
}

// writeWait bounds a check write, which its caller's cancel does not
// cut short.
const writeWait = time.Minute

func (r *Recorder) write(ctx context.Context, t Transition, key string, c forge.Check) error {
	prev, _ := r.Get(key)
	if err := Allowed(t, Status(prev.Status), Status(c.Status)); err != nil {
		return fmt.Errorf("write check %s: %w", key, err)
	}
	// A check this runner has not written or listed is a new record.
	write := pdsclient.Write{Collection: forge.CollectionCheck, Rkey: key, Value: c, New: prev.Status == ""}
	if sw := r.commit.sw; sw != nil && !write.New {
		write.Prev = r.cid(key)
		if write.Prev == "" {
			// Known without its CID (owed by an earlier process, or a
			// batch that did not say): the record is read first, and
			// written only if the move from what is there is allowed.
			var cur forge.Check
			cid, err := sw.Get(ctx, forge.CollectionCheck, key, &cur)
			switch {
			case errors.Is(err, pdsclient.ErrNotFound):
				write.New = true
			case err != nil:
				return fmt.Errorf("write check %s (%s): read the record first: %w", key, c.Status, err)
			case Allowed(t, Status(cur.Status), Status(c.Status)) != nil:
				return r.lost(key, cur, cid, c)
			default:
				write.Prev = cid
			}
		}
	}
	// Once begun, a write runs to its answer: cut short by its caller's
	// cancel (a superseded run), the PDS may take it all the same with
	// the answer lost, and the next write, a compare-and-swap from the
	// record known, would find one it does not know.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeWait)
	defer cancel()
	cid, err := r.commit.put(pctx, write)
	if errors.Is(err, pdsclient.ErrSwapLost) {
		// Another writer went first: what it wrote is read, never
		// overwritten blindly.
		var cur forge.Check
		rcid, rerr := r.commit.sw.Get(ctx, forge.CollectionCheck, key, &cur)
		if rerr != nil {
			r.KnowCID(key, "")
			return fmt.Errorf("write check %s (%s): %w; reading the record: %v", key, c.Status, err, rerr)
		}
		return r.lost(key, cur, rcid, c)
	}
	if err != nil {
		return fmt.Errorf("write check %s (%s): %w", key, c.Status, err)
	}
	r.KnowCID(key, cid)
	r.Know(key, c)
	if r.onWrite != nil {
		r.onWrite(key, c)
	}
	return nil
}

// Refresh reads the record of key from the PDS, unless this runner
// knows it final (a final check never changes), and knows it as read:
// another process of the runner (a replica) may have written it since
// this one last did. A record that is not there leaves what is known.
// Without a Swapper (a writer that cannot read) it does nothing.
func (r *Recorder) Refresh(ctx context.Context, key string) error {
	sw := r.commit.sw
	if c, ok := r.Get(key); sw == nil || (ok && Status(c.Status).Final()) {
		return nil
	}
	var cur forge.Check
	cid, err := sw.Get(ctx, forge.CollectionCheck, key, &cur)
	switch {
	case errors.Is(err, pdsclient.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("read check %s: %w", key, err)
	}
	r.Know(key, cur)
	r.KnowCID(key, cid)
	return nil
}

// lost resolves a write that lost its compare-and-swap: the record as
// read (cur, at cid) is what the check is now; mine is not written.
func (r *Recorder) lost(key string, cur forge.Check, cid string, mine forge.Check) error {
	r.Know(key, cur)
	r.KnowCID(key, cid)
	if r.swapLost != nil {
		r.swapLost()
	}
	return fmt.Errorf("write check %s (%s): %w: it is %s now", key, mine.Status, pdsclient.ErrSwapLost, cur.Status)
}

// Final writes a final check by t (Finish or Supersede). A record the
// PDS refuses as invalid is replaced by a minimal error check; when that
// is refused too, the check is remembered final all the same, so the
// work does not run again. Any other failure returns the check to owe
// (remembered final here) and the error: the caller keeps it and writes
// it later (Owe), the work does not run again. A move the table refuses
// is returned as an error, with nothing remembered.
func (r *Recorder) Final(ctx context.Context, t Transition, key string, c forge.Check, log *slog.Logger) (forge.Check, error) {
	err := r.Write(ctx, t, key, c)
	if err == nil {
		return c, nil
	}
	if errors.Is(err, pdsclient.ErrSwapLost) {
		// Another writer's check stands; it is not owed.
		log.Warn("the check was written by another writer; this final check is not written over it", "check", key, "err", err)
		cur, _ := r.Get(key)
		return cur, nil
	}
	var te *TransitionError
	if errors.As(err, &te) {
		return c, err
	}
	if Refused(err) {
		log.Error("the PDS refused the check record; writing a minimal error check instead", "check", key, "err", err)
		c = Minimal(c, err)
		if err = r.Write(ctx, Invalid, key, c); err == nil {
			return c, nil
		}
		if Refused(err) {
			log.Error("the PDS refused the minimal error check too; the work is not run again", "check", key, "err", err)
			r.Know(key, c)
			return c, nil
		}
	}
	r.Know(key, c)
	return c, &OwedError{Check: c, Err: err}
}

// OwedError is a final check the PDS did not take: the caller owes it.
type OwedError struct {
	Check forge.Check
	Err   error
}

func (e *OwedError) Error() string { return e.Err.Error() }
func (e *OwedError) Unwrap() error { return e.Err }

// Refused reports whether the PDS (or the lexicon, before the request:
// pdsclient.ErrInvalid) refused a record as invalid: HTTP 400 other than an
// authentication or rate-limit answer. Trying it again cannot help.
func Refused(err error) bool {
	if errors.Is(err, pdsclient.ErrInvalid) {
		return true
	}
	var ae *atclient.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest {
		return false
	}
	switch ae.Name {
	case "ExpiredToken", "InvalidToken", "AuthRequired", "AuthMissing", "RateLimitExceeded":
		return false
	}
	return true
}

// Minimal is the smallest valid final check of c's work, saying why the
// full one was refused.
func Minimal(c forge.Check, why error) forge.Check {
	now := forge.Now()
	m := forge.Check{Type: forge.CollectionCheck, Subject: c.Subject, Workflow: c.Workflow, Status: string(Error),
		CreatedAt: c.CreatedAt, StartedAt: c.StartedAt, FinishedAt: c.FinishedAt,
		Error: Truncate("check record refused: "+why.Error(), MaxError)}
	if m.CreatedAt == "" {
		m.CreatedAt = now
	}
	if m.FinishedAt == "" {
		m.FinishedAt = now
	}
	return m
}

// MaxError is the most bytes of a check's error the runner writes, and
// of the merge queue's texts (an ejection's detail, a batch's error): the
// lexicons' maxLength.
const MaxError = 3000

// MaxName is the most bytes of a step's name (and the failed step's) a
// check carries: the lexicon's maxLength.
const MaxName = 255

// Truncate keeps s within n bytes (a lexicon maxLength counts UTF-8
// bytes), ending it with "..." when it is cut. Every text the runner
// writes into a record goes through it. The result is valid UTF-8:
// bytes that are not become U+FFFD, and the cut never splits a
// character, else the record would be invalid.
func Truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
