// Package forge is knotless on atproto, as values: the dev.knotless.*
// records as Go types, their collections and statuses, the keys of
// checks and of the merge queue's records, the runner's saved session,
// and the sealing of secrets to a runner's key. It reaches no network:
// reading and writing records, validated against their lexicons, is
// internal/forge/pdsclient's.
package forge

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// The collections (record NSIDs).
const (
	CollectionRepo      = "dev.knotless.repo"
	CollectionRefUpdate = "dev.knotless.refUpdate"
	CollectionPull      = "dev.knotless.pull"
	CollectionCheck     = "dev.knotless.check"
	CollectionSecret    = "dev.knotless.secret"
)

// Check statuses beyond the run's final ones.
const (
	StatusQueued  = "queued"
	StatusRunning = "running"
)

// Pull states.
const (
	PullOpen   = "open"
	PullClosed = "closed"
	PullMerged = "merged"
)

// Subject kinds.
const (
	KindPush = "push"
	KindPull = "pull"
)

// ScopePush is the only secret scope: trusted runs (pushes by the owner).
const ScopePush = "push"

// Repo is a dev.knotless.repo record; its key is Name.
type Repo struct {
	Type          string   `json:"$type"`
	Name          string   `json:"name"`
	Source        string   `json:"source"`
	DefaultBranch string   `json:"defaultBranch,omitempty"`
	Runners       []string `json:"runners,omitempty"`
	Landers       []string `json:"landers,omitempty"`
	CreatedAt     string   `json:"createdAt"`
}

// NamesRunner reports whether the repository names runner did.
func (r *Repo) NamesRunner(did string) bool {
	for _, d := range r.Runners {
		if d == did {
			return true
		}
	}
	return false
}

// RefUpdate is a dev.knotless.refUpdate record: a push.
type RefUpdate struct {
	Type      string `json:"$type"`
	Repo      string `json:"repo"`
	Ref       string `json:"ref"`
	Old       string `json:"old,omitempty"`
	New       string `json:"new"`
	CreatedAt string `json:"createdAt"`
}

// Deleted reports whether the push deleted its ref.
func (u *RefUpdate) Deleted() bool { return strings.Trim(u.New, "0") == "" }

// Pull is a dev.knotless.pull record.
type Pull struct {
	Type      string   `json:"$type"`
	Repo      string   `json:"repo"`
	Base      string   `json:"base"`
	Head      PullHead `json:"head"`
	Title     string   `json:"title"`
	State     string   `json:"state"`
	CreatedAt string   `json:"createdAt"`
}

// PullHead is what a pull proposes.
type PullHead struct {
	Source string `json:"source"`
	Ref    string `json:"ref"`
	Commit string `json:"commit"`
}

// Check is a dev.knotless.check record.
type Check struct {
	Type       string       `json:"$type"`
	Subject    Subject      `json:"subject"`
	Workflow   string       `json:"workflow"`
	Status     string       `json:"status"`
	StartedAt  string       `json:"startedAt,omitempty"`
	FinishedAt string       `json:"finishedAt,omitempty"`
	FailedStep string       `json:"failedStep,omitempty"`
	Steps      []CheckStep  `json:"steps,omitempty"`
	Log        *atdata.Blob `json:"log,omitempty"`
	Outputs    []Output     `json:"outputs,omitempty"`
	Live       *LiveOutput  `json:"live,omitempty"`
	Files      []RunFile    `json:"files,omitempty"`
	Error      string       `json:"error,omitempty"`
	// Attempt is which run of the work this is: 0 or 1 for the first,
	// n for the (n-1)th re-run (AttemptKey).
	Attempt int64 `json:"attempt,omitempty"`
	// Cause is the rerun or dispatch record that made the check.
	Cause string `json:"cause,omitempty"`
	// CancelledBy is the cancel record that stopped the run.
	CancelledBy string `json:"cancelledBy,omitempty"`
	// QueuedBehind is, on a queued record, how many runs were waiting
	// ahead of it when it was written (0: none, left out).
	QueuedBehind int64 `json:"queuedBehind,omitempty"`
	// Tries is, on a final record, how many runs of the work its
	// workflow's retry made (2 or more; 0: one, left out).
	Tries     int64  `json:"tries,omitempty"`
	CreatedAt string `json:"createdAt"`
}

// AttemptNumber is the check's attempt, 1 for a check that names none.
func (c *Check) AttemptNumber() int64 { return max(c.Attempt, 1) }

// LiveOutput says where a check's output is read while it runs, and its
// files after (dev.knotless.defs#liveOutput).
type LiveOutput struct {
	// Service is the base URL of an XRPC host serving
	// dev.knotless.getRunOutput and subscribeRunOutput for the check.
	Service string `json:"service"`
	// Page is the page that follows the output in a browser.
	Page string `json:"page,omitempty"`
}

// RunFile is an output file of a run kept for download where the
// check's LiveOutput says (dev.knotless.defs#runFile).
type RunFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// Final reports whether the check's status is a final one.
func (c *Check) Final() bool {
	return c.Status != StatusQueued && c.Status != StatusRunning
}

// Subject is what a check is about.
type Subject struct {
	Repo   string `json:"repo"`
	Commit string `json:"commit"`
	Ref    string `json:"ref,omitempty"`
	Event  string `json:"event"`
	Kind   string `json:"kind"`
	// Tick is a schedule's tick (kind schedule), as control.TickID
	// writes it.
	Tick string `json:"tick,omitempty"`
}

// CheckStep is one step's outcome.
type CheckStep struct {
	Name       string `json:"name"`
	Status     string `json:"status"`
	ExitCode   *int64 `json:"exitCode,omitempty"`
	DurationMs int64  `json:"durationMs"`
	TimedOut   bool   `json:"timedOut,omitempty"`
}

// Output is an image a run wrote to its outputs directory.
type Output struct {
	Path string      `json:"path"`
	Blob atdata.Blob `json:"blob"`
}

// Secret is a dev.knotless.secret record.
type Secret struct {
	Type      string       `json:"$type"`
	Repo      string       `json:"repo"`
	Name      string       `json:"name"`
	Runner    string       `json:"runner"`
	Key       string       `json:"key,omitempty"`
	Scope     string       `json:"scope"`
	Sealed    atdata.Bytes `json:"sealed"`
	CreatedAt string       `json:"createdAt"`
}

// CheckKey is the record key of the first attempt of the check for
// workflow on the subject: the same work always has the same key, so a
// restarted runner updates its check instead of writing a second one.
//
// For a push, pull or batch it is the first 16 bytes of
// sha256(kind "\n" event "\n" commit "\n" workflow), unpadded base32,
// lower case: 26 characters. The kind is part of it so that a pull
// (untrusted) never shares a push's key, whatever its event URI.
//
// A dispatch runs once per record, whatever its ref's head is when it is
// read: sha256("dispatch" "\n" event "\n" workflow). A schedule runs
// once per tick, whatever the default branch's head is:
// sha256("schedule" "\n" repo "\n" tick "\n" workflow). Same encoding.
func CheckKey(s Subject, workflow string) string {
	switch s.Kind {
	case KindDispatch:
		return key(KindDispatch + "\n" + s.Event + "\n" + workflow)
	case KindSchedule:
		return key(KindSchedule + "\n" + s.Repo + "\n" + s.Tick + "\n" + workflow)
	}
	return key(s.Kind + "\n" + s.Event + "\n" + s.Commit + "\n" + workflow)
}

// AttemptKey is the record key of the given attempt of the check for
// workflow on the subject: CheckKey for the first (attempt 1, or less),
// else the first 16 bytes of sha256("attempt" "\n" CheckKey "\n"
// attempt), attempt in decimal, same encoding. A re-run is a check of its
// own, and the first attempt keeps the key it always had.
func AttemptKey(s Subject, workflow string, attempt int64) string {
	first := CheckKey(s, workflow)
	if attempt <= 1 {
		return first
	}
	return key("attempt\n" + first + "\n" + strconv.FormatInt(attempt, 10))
}

// Now formats t as an atproto datetime.
func Now() string { return Datetime(time.Now()) }

// Datetime formats t as an atproto datetime (UTC, milliseconds).
func Datetime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// RepoURI is the AT-URI of owner's repository name.
func RepoURI(owner syntax.DID, name string) syntax.ATURI {
	return syntax.ATURI(fmt.Sprintf("at://%s/%s/%s", owner, CollectionRepo, name))
}
