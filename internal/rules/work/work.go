// Package work is what a runner finds to do, as values: an Event (a
// push, a pull, a batch, a landing, or the work a run-control record or
// a schedule's tick makes) with the records it comes from, and the keys
// of its work and of its checks. internal/forge/ingest finds events by
// listing records; intake, the scheduler, the lander and the checks
// pass them on; job keeps one in each job. It reaches no network.
package work

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/workflow"
)

// Event is work found in records that may need runs: a push, a pull,
// a batch or a landing of the merge queue, or run-control work (a
// re-run, a dispatch, a schedule's tick).
type Event struct {
	Kind string // forge.KindPush or forge.KindPull
	// URI is the refUpdate or pull record.
	URI  syntax.ATURI
	Repo forge.Record[forge.Repo]
	// Ref is the pushed ref, or the pull's base branch as refs/heads/….
	Ref string
	// Commit is the pushed commit, or the pull's head commit.
	Commit string
	Push   *forge.RefUpdate
	Pull   *forge.Pull
	// Trusted is true for a push written by the repository's owner, and
	// for a landing written by the repository's lander.
	Trusted bool
	// Preflight marks a queued pull's pre-flight (the lander's work): its
	// queue: first workflows run, not its on: pull ones.
	Preflight bool
	// Vars are run variables the event gives its runs from outside the
	// workflow files (a re-run's env, a dispatch's inputs): intake hands
	// them to each of its jobs, the scheduler to run.Request.Vars.
	Vars []workflow.EnvVar `json:",omitempty"`
	// Run control (control.go): the record that made the work, the
	// workflows it runs, a schedule's tick, a re-run dispatch's inputs.
	Control
}

// Key identifies the event's work: the record and its commit (a pull
// whose head moves is new work); for work a run-control record made,
// that record and the commit; for a schedule, its workflow and tick.
func (e Event) Key() string {
	switch {
	case e.Preflight:
		return "preflight " + e.URI.String() + "@" + e.Commit
	case e.Cause != "":
		return e.Cause + "@" + e.Commit
	case e.Kind == forge.KindSchedule:
		return "schedule " + e.URI.String() + " " + strings.Join(slices.Sorted(maps.Keys(e.Workflows)), ",") + " " + e.Tick
	}
	return e.URI.String() + "@" + e.Commit
}

// Owner is the repository's owner.
func (e Event) Owner() syntax.DID {
	d, _ := e.Repo.URI.Authority().AsDID()
	return d
}

// Subject is the check subject of the event.
func (e Event) Subject() forge.Subject {
	return forge.Subject{Repo: e.Repo.URI.String(), Commit: e.Commit, Ref: e.Ref, Event: e.URI.String(), Kind: e.Kind, Tick: e.Tick}
}

// Branch is the branch a workflow's branches filter matches: the pushed
// branch, or the pull's base.
func (e Event) Branch() string { return strings.TrimPrefix(e.Ref, "refs/heads/") }

// Control is what makes an event run-control work: a re-run, a
// dispatch or a schedule's tick (docs/design/protocol.md, "Run
// control"). The zero value is a push's or a pull's.
type Control struct {
	// Cause is the rerun or dispatch record that made the work: each of
	// its checks names it, and the author caps count its runs and check
	// writes against the record's account (job.Author).
	Cause string `json:",omitempty"`
	// Workflows, when set, are the only workflows that run, each at its
	// attempt: 1 (the first) keeps the check key it always had, n > 1
	// (a re-run) is keyed by forge.AttemptKey.
	Workflows map[string]int64 `json:",omitempty"`
	// Tick is a schedule's tick (kind schedule), as control.TickID
	// writes it.
	Tick string `json:",omitempty"`
	// Inputs are the inputs of the dispatch record a re-run of a
	// dispatch runs again, as the record gives them (nil for any other
	// work): intake checks them against the workflow
	// (workflow.Workflow.DispatchVars) and puts Vars, the re-run's env,
	// on top.
	Inputs []workflow.EnvVar `json:",omitempty"`
}

// CheckKey is the record key of the check of workflow wf of the event:
// forge.CheckKey of its subject, or, for a re-run's attempt n > 1,
// forge.AttemptKey.
func (e Event) CheckKey(wf string) string {
	return forge.AttemptKey(e.Subject(), wf, e.Workflows[wf])
}

// Attempt is the attempt workflow wf of the event runs as, for its
// check's attempt field: 0 (left out) for a first attempt.
func (e Event) Attempt(wf string) int64 {
	if n := e.Workflows[wf]; n > 1 {
		return n
	}
	return 0
}

// Order ranks the event's trusted cache saves (run.CacheScope.Order):
// its record key, a TID (the later push orders higher); for a schedule,
// whose event is the repository record, a TID of its tick.
func (e Event) Order() string {
	if e.Kind == forge.KindSchedule {
		if t, err := time.Parse(time.RFC3339, e.Tick); err == nil {
			return syntax.NewTIDFromTime(t, 0).String()
		}
	}
	return e.URI.RecordKey().String()
}

// CondEvent is what the steps' conditions read of the event: its kind,
// ref, a pull's base branch and whether it is trusted.
func (e Event) CondEvent() workflow.CondEvent {
	c := workflow.CondEvent{Kind: e.Kind, Ref: e.Ref, Trusted: e.Trusted}
	if e.Pull != nil {
		c.Base = e.Pull.Base
	}
	return c
}
