// Package job is what the daemon's parts all name: one workflow to run
// for one event (Job), what state.json keeps of a started one (Saved),
// the git mirror port they share (Mirrors, Repo) with its values
// (Origin, SquashPull, Squashed, Identity), and the pure rules on
// jobs that intake, the scheduler and the lander all apply: what
// supersedes what, whom a job counts against, which mirror an event's
// objects go into and which workflows run for an event. It does no I/O
// and imports no mirror, network or process package: its event is
// internal/rules/work's, its records internal/forge's.
package job

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// Job is one workflow to run for one event, as intake asks for it. It
// does not change once made; the scheduler keeps what happens to it.
type Job struct {
	// Key is the check's record key.
	Key      string
	Event    work.Event
	Workflow *workflow.Workflow
	// Repo is the mirror the tree is exported from.
	Repo Repo
	// Tree is what to export: the pushed commit or the merge's tree.
	Tree string
	// Vars are run variables given from outside the workflow file (a
	// re-run's env, a dispatch's inputs), handed to the engine as
	// run.Request.Vars.
	Vars []workflow.EnvVar
}

// New is the job of workflow wf for event ev, run from tree of repo: its
// key is the check's of ev's attempt of wf (work.Event.CheckKey).
func New(ev work.Event, wf *workflow.Workflow, repo Repo, tree string) *Job {
	return &Job{Key: ev.CheckKey(wf.Name), Event: ev, Workflow: wf, Repo: repo, Tree: tree}
}

// Group is what supersedes: the same workflow on the same ref (a push)
// or the same pull. Work a run-control record or a schedule made is a
// group of its own: an owner's explicit re-run or dispatch, or a tick,
// neither supersedes nor is superseded.
func (j *Job) Group() string {
	if j.Event.Cause != "" || j.Event.Kind == forge.KindSchedule {
		return "own " + j.Key
	}
	if j.Event.Kind == forge.KindPull || j.Event.Kind == forge.KindBatch {
		return "pull " + j.Event.URI.String() + " " + j.Workflow.Name
	}
	return "push " + j.Event.Repo.URI.String() + " " + j.Event.Ref + " " + j.Workflow.Name
}

// Older reports whether a's event came before b's (record keys of both
// kinds are TIDs, which sort by time).
func Older(a, b *Job) bool {
	if a.Event.URI == b.Event.URI {
		return a.Event.Commit != b.Event.Commit && a.Event.Pull != nil && b.Event.Pull != nil
	}
	return a.Event.URI.RecordKey().String() < b.Event.URI.RecordKey().String()
}

// SupersededBy reports whether ev supersedes j's run (the queue's add):
// a newer commit of the same pull, or a newer push of the same ref,
// unless j's workflow lets its older runs finish.
func SupersededBy(j *Job, ev work.Event) bool {
	if (j.Workflow != nil && j.Workflow.Superseded == "finish") || j.Event.Cause != "" || ev.Cause != "" {
		return false
	}
	switch ev.Kind {
	case forge.KindPull:
		return j.Event.Kind == forge.KindPull && j.Event.URI == ev.URI && j.Event.Commit != ev.Commit
	case forge.KindPush:
		return j.Event.Kind == forge.KindPush && j.Event.Repo.URI == ev.Repo.URI && j.Event.Ref == ev.Ref &&
			j.Event.URI.RecordKey().String() < ev.URI.RecordKey().String()
	}
	return false
}

// Author is whom the author caps count an event against: the account
// that wrote an untrusted pull (its record's); with all (the limits
// apply to all runs: --limits-apply-to all), also the owner of a
// pushed repository. A re-run or dispatch counts against the account
// that wrote its record (Cause), whatever its trust, and a schedule's
// tick against the repository's owner, whatever all says: nothing
// bounds ticks but the workflow files, which may tick every minute. ""
// for work never capped by author: a trusted push by default, and a
// merge-queue batch (the owner queued its pulls; --queue-batch bounds
// it).
func Author(ev work.Event, all bool) string {
	switch {
	case ev.Cause != "":
		return syntax.ATURI(ev.Cause).Authority().String()
	case ev.Kind == forge.KindBatch:
		return ""
	case ev.Kind == forge.KindSchedule:
		return ev.Repo.URI.Authority().String()
	case ev.Trusted && all:
		return ev.Repo.URI.Authority().String()
	case ev.Trusted:
		return ""
	}
	return ev.URI.Authority().String()
}

// CheckAuthor is whom a check write is counted against, as Author
// counts its event: a pull's check against the pull's author, a tick's
// against the repository's owner, with all a push's too.
func CheckAuthor(c forge.Check, all bool) string {
	switch {
	case c.Cause != "":
		return syntax.ATURI(c.Cause).Authority().String()
	case c.Subject.Kind == forge.KindPull:
		return syntax.ATURI(c.Subject.Event).Authority().String()
	case c.Subject.Kind == forge.KindSchedule:
		return syntax.ATURI(c.Subject.Repo).Authority().String()
	case c.Subject.Kind == forge.KindPush && all:
		return syntax.ATURI(c.Subject.Repo).Authority().String()
	}
	return ""
}

// MirrorKey names the mirror an event's objects go into: a push's is
// its repository's; a pull has one of its own, so that nothing it
// fetched is in a mirror a push (or another pull) runs from; a batch's
// is the lander's own (BatchMirrorKey).
func MirrorKey(ev work.Event) string {
	if ev.Kind == forge.KindBatch {
		return BatchMirrorKey(ev.Repo.URI.String())
	}
	if ev.Kind == forge.KindPull {
		return "pull " + ev.URI.String()
	}
	return ev.Repo.URI.String()
}

// BatchMirrorKey is the mirror the lander squashes a repository's
// batches in: its own, apart from the pushes' and each pull's.
func BatchMirrorKey(repo string) string { return "batch " + repo }

// RunsFor reports whether wf runs for ev (Runs): a workflow whose if
// cannot be decided is counted, since it gets an error check.
func RunsFor(wf *workflow.Workflow, ev work.Event) bool {
	ok, err := Runs(wf, ev)
	return ok || err != nil
}

// Runs reports whether wf (a workflow or a matrix's leg,
// workflow.Plan) runs for ev: a pre-flight runs the queue:
// first workflows, a batch the on: batch ones, a pull the on: pull ones
// and a push the on: push ones, each where the workflow's if holds for
// the event; run-control work (a re-run, a dispatch, a tick) the
// workflows it names, whatever their if. The error is an if that
// cannot be decided (its cost bound): the workflow is not run, and its
// check is an error naming it.
func Runs(wf *workflow.Workflow, ev work.Event) (bool, error) {
	var on bool
	switch {
	case ev.Workflows != nil:
		// A matrix's leg runs when its own name is named (a re-run of
		// it) or its matrix's (a dispatch or tick of the workflow).
		_, ok := ev.Workflows[wf.Name]
		if wf.Leg != nil && !ok {
			_, ok = ev.Workflows[wf.Leg.Base]
		}
		return ok, nil
	case ev.Preflight:
		on = wf.Queue == "first"
	case ev.Kind == forge.KindBatch:
		on = wf.Matches(workflow.Batch, ev.Branch())
	case ev.Kind == forge.KindPull:
		on = wf.Matches(workflow.Pull, ev.Branch())
	default:
		on = wf.Matches(workflow.Push, ev.Branch())
	}
	if !on {
		return false, nil
	}
	return wf.Holds(ev.CondEvent(), nil)
}

// PathTrigger is the trigger whose path filters (paths, paths-ignore)
// decide whether a workflow runs for ev: a push's, a pull's, and a
// pull's pre-flight's (its check is the pull's, so the pull's filters
// decide it the same); none for a batch and for run-control work (a
// re-run, a dispatch, a tick run the workflows they name).
func PathTrigger(ev work.Event) (workflow.Trigger, bool) {
	if ev.Workflows != nil || ev.Cause != "" {
		return "", false
	}
	switch ev.Kind {
	case forge.KindPush:
		return workflow.Push, true
	case forge.KindPull:
		return workflow.Pull, true
	}
	return "", false
}

// ChangeRange is what a path filter reads of ev: the commits the change
// is between, from its first (before) to its last (after), and whether
// from is the base branch, to be taken to its merge base with after (a
// pull). A push's before is the ref update's old commit; a pull's is its
// base branch's head (base). ok is false when there is no such range: a
// push that made its ref (no old commit).
func ChangeRange(ev work.Event, base string) (from, to string, mergeBase, ok bool) {
	switch {
	case ev.Kind == forge.KindPull:
		return base, ev.Commit, true, base != ""
	case ev.Push != nil && strings.Trim(ev.Push.Old, "0") != "":
		return ev.Push.Old, ev.Commit, false, true
	}
	return "", "", false, false
}

// Saved is what state.json keeps of a started run's job, so that a
// successor can adopt the run without listing.
type Saved struct {
	Event work.Event  `json:"event"`
	Tree  string      `json:"tree"`
	Check forge.Check `json:"check"`
	// Vars are the job's run variables (a dispatch's inputs with their
	// defaults, a re-run's env): a successor's run gets them too.
	Vars []workflow.EnvVar `json:"vars,omitempty"`
}

// Encode is what state.json keeps of j, whose check is c.
func Encode(j *Job, c forge.Check) (json.RawMessage, error) {
	b, err := json.Marshal(Saved{Event: j.Event, Tree: j.Tree, Check: c, Vars: j.Vars})
	if err != nil {
		return nil, fmt.Errorf("encode job %s: %w", j.Key, err)
	}
	return b, nil
}

// Decode reads what Encode wrote.
func Decode(b json.RawMessage) (Saved, error) {
	var s Saved
	if err := json.Unmarshal(b, &s); err != nil {
		return Saved{}, fmt.Errorf("decode job: %w", err)
	}
	return s, nil
}

// Mirrors opens the git mirror of a key (MirrorKey); mirror.Mirrors is
// the real one. It is the git port intake, the scheduler and the lander
// share.
type Mirrors interface {
	Open(ctx context.Context, key string) (Repo, error)
}

// Repo is one mirror (mirror.Repo, through mirror.Port):
// fetch an event's commit, merge a pull, read the workflows of a tree,
// list what a change touched and export it for a run; for the lander, squash a batch and push it
// with a lease (with the push credentials the daemon bound to the
// lander's mirrors).
type Repo interface {
	Fetch(ctx context.Context, origin Origin, source, ref, commit string) error
	Branch(ctx context.Context, source, branch string) (string, error)
	Merge(ctx context.Context, base, head string) (string, error)
	Workflows(ctx context.Context, treeish string) ([]*workflow.Workflow, []error, error)
	Export(ctx context.Context, treeish, dir string) error
	Squash(ctx context.Context, base string, pulls []SquashPull, who Identity, at time.Time) (string, []Squashed, error)
	Push(ctx context.Context, source, branch, old, new string) error
	Has(ctx context.Context, commit string) bool
	// Changed lists the paths that differ from commit from to to (with
	// mergeBase, from their merge base): what a push or a pull changed,
	// for the workflows' path filters.
	Changed(ctx context.Context, from, to string, mergeBase bool) ([]string, error)
}

// Origin says who named a git source, which decides what it may be
// (mirror.Origin).
type Origin int

const (
	// OwnerSource is the repository record's own source.
	OwnerSource Origin = iota
	// PullSource is a pull's head.source, named by whoever wrote the
	// pull.
	PullSource
)

// Identity is the author and committer of the merge queue's squashed
// commits (mirror.Identity).
type Identity struct {
	Name, Email string
}

// SquashPull is one pull to squash (mirror.SquashPull): its head commit
// (already fetched into the mirror) and the commit message.
type SquashPull struct {
	Head    string
	Message string
}

// Squashed is how one pull went onto the stack (mirror.Squashed):
// Commit is its squashed commit when it merged, else Conflicts are the
// conflicting paths and ConflictsWithBase says whether it does not
// merge onto the base alone either.
type Squashed struct {
	Head              string
	Commit            string
	Changed           []string
	Conflicts         []string
	ConflictsWithBase bool
}
