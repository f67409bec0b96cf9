// Package forge is knotless on atproto: the dev.knotless.* records as Go
// types, validated against their lexicons on every read and write, the
// runner's account (login, session, checks, blobs), public reads of other
// accounts' records, and the sealing of secrets to a runner's key.
package forge

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/lexicon"
	"github.com/bluesky-social/indigo/atproto/syntax"

	lexicons "knotless.dev/run/lexicons/dev/knotless"
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
	CreatedAt   string `json:"createdAt"`
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

// Catalog is the set of knotless lexicons.
type Catalog struct {
	cat *lexicon.BaseCatalog
	// objects maps an object def ("dev.knotless.putRunOutput#input") to
	// the record type wrapping it, which is how ValidateObject validates
	// an XRPC body with indigo's record validator.
	objects map[string]string
}

// NewCatalog loads the embedded knotless lexicons.
func NewCatalog() (*Catalog, error) {
	cat := lexicon.NewBaseCatalog()
	if err := cat.LoadEmbedFS(lexicons.Files); err != nil {
		return nil, fmt.Errorf("load knotless lexicons: %w", err)
	}
	objects, err := wrapObjects(cat)
	if err != nil {
		return nil, fmt.Errorf("load knotless lexicons: %w", err)
	}
	return &Catalog{cat: cat, objects: objects}, nil
}

// wrapObjects adds, for each object def of the embedded lexicons, a
// record type whose one property v is a ref to it, and returns the map
// from def to that record type.
func wrapObjects(cat *lexicon.BaseCatalog) (map[string]string, error) {
	entries, err := fs.ReadDir(lexicons.Files, ".")
	if err != nil {
		return nil, err
	}
	objects := map[string]string{}
	for _, e := range entries {
		b, err := lexicons.Files.ReadFile(e.Name())
		if err != nil {
			return nil, err
		}
		var f struct {
			ID   string `json:"id"`
			Defs map[string]struct {
				Type string `json:"type"`
			} `json:"defs"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		names := make([]string, 0, len(f.Defs))
		for name, d := range f.Defs {
			if d.Type == "object" {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		for _, name := range names {
			ref := f.ID + "#" + name
			id := fmt.Sprintf("dev.knotless.validate.object%d", len(objects))
			wrapper := fmt.Sprintf(`{"lexicon":1,"id":%q,"defs":{"main":{"type":"record","key":"any","record":{"type":"object","required":["v"],"properties":{"v":{"type":"ref","ref":%q}}}}}}`, id, ref)
			var sf lexicon.SchemaFile
			if err := json.Unmarshal([]byte(wrapper), &sf); err != nil {
				return nil, err
			}
			if err := cat.AddSchemaFile(sf); err != nil {
				return nil, fmt.Errorf("wrap %s: %w", ref, err)
			}
			objects[ref] = id
		}
	}
	return objects, nil
}

// ValidateObject checks the JSON of an object of the knotless lexicons
// that is not a record (an XRPC method's input or output, as
// "dev.knotless.putRunOutput#input") against its lexicon.
func (c *Catalog) ValidateObject(ref string, raw []byte) error {
	id, ok := c.objects[ref]
	if !ok {
		return fmt.Errorf("validate %s: no such object in the knotless lexicons", ref)
	}
	data, err := atdata.UnmarshalJSON(raw)
	if err != nil {
		return lexiconError{fmt.Errorf("%s: %w", ref, err)}
	}
	wrapped := map[string]any{"$type": id, "v": data}
	if err := lexicon.ValidateRecord(c.cat, wrapped, id, lexicon.AllowLenientDatetime); err != nil {
		return lexiconError{fmt.Errorf("%s: %w", ref, err)}
	}
	return nil
}

// Validate checks the JSON of a record against the lexicon of
// collection.
func (c *Catalog) Validate(collection string, raw []byte) error {
	data, err := atdata.UnmarshalJSON(raw)
	if err != nil {
		return lexiconError{fmt.Errorf("%s record: %w", collection, err)}
	}
	if err := lexicon.ValidateRecord(c.cat, data, collection, lexicon.AllowLenientDatetime); err != nil {
		return lexiconError{fmt.Errorf("%s record: %w", collection, err)}
	}
	return nil
}

// ErrInvalid is a record that does not match its lexicon (Validate,
// also before a write): sending it again cannot help.
var ErrInvalid = errors.New("record does not match its lexicon")

// lexiconError is a Validate error: its text, and errors.Is ErrInvalid.
type lexiconError struct{ error }

func (e lexiconError) Is(target error) bool { return target == ErrInvalid }
func (e lexiconError) Unwrap() error        { return e.error }

// Decode validates raw as a record of collection and decodes it into v.
func (c *Catalog) Decode(collection string, raw []byte, v any) error {
	if err := c.Validate(collection, raw); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s record: %w", collection, err)
	}
	return nil
}

// Encode marshals v, validates it as a record of
// collection and returns it as a plain JSON object for the write calls.
func (c *Catalog) Encode(collection string, v any) (map[string]any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s record: %w", collection, err)
	}
	if err := c.Validate(collection, raw); err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("encode %s record: %w", collection, err)
	}
	return m, nil
}

// RepoURI is the AT-URI of owner's repository name.
func RepoURI(owner syntax.DID, name string) syntax.ATURI {
	return syntax.ATURI(fmt.Sprintf("at://%s/%s/%s", owner, CollectionRepo, name))
}
