// Package mergequeue is the merge queue's pure core: which runner lands,
// the queue's order, which pulls need a pre-flight, which leave the
// queue and why, what the next batch is, how a failed batch is bisected,
// and what a restarted lander does with a batch it had begun. It does no
// I/O: the daemon reads the records and the git source, asks this
// package what to do, and does it.
package mergequeue

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"knotless.dev/run/internal/forge"
)

// PullCommit is a pull at one head commit: the unit that is queued,
// pre-flighted, batched, ejected and landed.
type PullCommit struct {
	Pull   string
	Commit string
}

func (p PullCommit) String() string { return p.Pull + "@" + short(p.Commit) }

// Entry is one queue entry of the owner: the pull, the head commit and
// the base branch the owner approved.
type Entry struct {
	Key    string // record key
	Pull   string
	Commit string
	// Base is the branch the entry approved the pull onto; "" for an
	// entry written before entries named one (it is ejected: noBase).
	Base      string
	CreatedAt string
}

// Pull is what the queue needs of a pull record; a pull missing from
// Input.Pulls is gone (deleted or unreadable).
type Pull struct {
	Repo string // target repository AT-URI
	Base string // branch name
	Head string // current head commit
	Open bool
}

// Verdict is the state of one pre-flight.
type Verdict int

// Pre-flight verdicts.
const (
	// NotRun: no pre-flight has started for the pull at this commit.
	NotRun Verdict = iota
	// Pending: the pre-flight checks are queued or running.
	Pending
	// Passed: every pre-flight workflow succeeded.
	Passed
	// Failed: a pre-flight workflow did not succeed.
	Failed
	// Conflict: the pull does not merge onto the base.
	Conflict
)

// Preflight is one pull's pre-flight outcome; Detail names the failing
// workflow or the conflicting paths.
type Preflight struct {
	Verdict Verdict
	Detail  string
}

// Input is what the lander knows of one repository's queue.
type Input struct {
	Repo string // the repository's AT-URI
	// Lander is this runner's DID; MayLand whether the repository
	// record's landers name it (MayPush). A runner they do not name may
	// not push, so it ejects every entry (notLander) instead of
	// pre-flighting or batching it.
	Lander  string
	MayLand bool
	Entries []Entry
	Pulls   map[string]Pull
	// Preflights are the outcomes so far, by pull and commit.
	Preflights map[PullCommit]Preflight
	// NeedPreflight is whether any workflow has queue: first.
	NeedPreflight bool
	// Done are the pulls at a commit that already have an ejection or
	// were landed: they are never acted on again.
	Done map[PullCommit]bool
}

// Queued is a pull in the queue, with the base branch it targets.
type Queued struct {
	PullCommit
	Base string
}

// Ejection is a pull leaving the queue and why.
type Ejection struct {
	PullCommit
	Reason string // forge.Eject*
	Detail string
}

// Plan is what to do with the queue now.
type Plan struct {
	// Eject are pulls to take out, each with its reason.
	Eject []Ejection
	// Preflight are pulls whose pre-flight must start.
	Preflight []Queued
	// Pending are pulls whose pre-flight is running.
	Pending []Queued
	// Ready are pulls that may join a batch, in queue order.
	Ready []Queued
}

// Settled reports whether no pre-flight is to start or running: only
// then does a batch start, so that it takes every pull ready by then
// (pulls queued together land together) rather than the first one to
// pass.
func (p Plan) Settled() bool { return len(p.Preflight) == 0 && len(p.Pending) == 0 }

// Order returns the entries that count, in queue order: by createdAt,
// then record key; for a pull queued more than once, its last entry
// (a re-queue after its head moved), at that entry's place.
func Order(entries []Entry) []Entry {
	sorted := slices.Clone(entries)
	slices.SortStableFunc(sorted, func(a, b Entry) int {
		return cmp.Or(strings.Compare(a.CreatedAt, b.CreatedAt), strings.Compare(a.Key, b.Key))
	})
	last := map[string]int{}
	for i, e := range sorted {
		last[e.Pull] = i
	}
	var out []Entry
	for i, e := range sorted {
		if last[e.Pull] == i {
			out = append(out, e)
		}
	}
	return out
}

// Decide plans the queue: every entry leaves it when this runner is not
// among the repository's landers; entries whose pull closed, whose head
// moved or whose base is not the one the entry approved (or that name no
// base) leave it; pre-flights gate entry, and what remains is ready in
// order. Entries already done (ejected or landed at that commit), and
// entries for a pull of another repository, are skipped: deciding again
// over the same records gives no second ejection.
func Decide(in Input) Plan {
	var p Plan
	for _, e := range Order(in.Entries) {
		pc := PullCommit{Pull: e.Pull, Commit: e.Commit}
		if in.Done[pc] {
			continue
		}
		pull, ok := in.Pulls[e.Pull]
		if ok && pull.Repo != in.Repo {
			continue
		}
		eject := func(reason, detail string) {
			p.Eject = append(p.Eject, Ejection{PullCommit: pc, Reason: reason, Detail: detail})
		}
		switch {
		case !in.MayLand:
			eject(forge.EjectNotLander, fmt.Sprintf("this runner (%s) is not among the repository's landers, so it pushes nothing; "+
				"the owner adds it to the repo record's landers to let it land", in.Lander))
			continue
		case !ok:
			eject(forge.EjectClosed, "the pull record is gone")
			continue
		case !pull.Open:
			eject(forge.EjectClosed, "the pull is no longer open")
			continue
		case e.Base == "":
			eject(forge.EjectNoBase, "the queue entry names no base branch, so what the owner approved is unknown; "+
				"queue the pull again with base set to the branch it is to land on")
			continue
		case pull.Base != e.Base:
			eject(forge.EjectBaseChanged, fmt.Sprintf("base changed after queueing: the entry approved %q, the pull now targets %q; "+
				"queue it again to land it there", e.Base, pull.Base))
			continue
		case pull.Head != e.Commit:
			eject(forge.EjectHeadMoved, fmt.Sprintf("the head moved from the approved %s to %s", short(e.Commit), short(pull.Head)))
			continue
		}
		q := Queued{PullCommit: pc, Base: e.Base}
		if !in.NeedPreflight {
			p.Ready = append(p.Ready, q)
			continue
		}
		pf := in.Preflights[pc]
		switch pf.Verdict {
		case NotRun:
			p.Preflight = append(p.Preflight, q)
		case Pending:
			p.Pending = append(p.Pending, q)
		case Passed:
			p.Ready = append(p.Ready, q)
		case Failed:
			p.Eject = append(p.Eject, Ejection{PullCommit: pc, Reason: forge.EjectPreflight, Detail: pf.Detail})
		case Conflict:
			p.Eject = append(p.Eject, Ejection{PullCommit: pc, Reason: forge.EjectConflictBase, Detail: pf.Detail})
		}
	}
	return p
}

// Bisect is the lander's memory of a failed batch, kept in its state
// file: the pulls under suspicion and how many of them the next batch
// may hold. The zero value is no bisection.
type Bisect struct {
	Suspects []PullCommit `json:"suspects,omitempty"`
	Limit    int          `json:"limit,omitempty"`
}

// Next is the next batch from the ready pulls: the first ready pull's
// base branch, and the ready pulls for that branch in order, at most max
// (0: no limit). While a bisection is on, it takes only suspects, at
// most b.Limit of them; suspects no longer ready are forgotten.
func Next(ready []Queued, max int, b Bisect) []Queued {
	if len(ready) == 0 {
		return nil
	}
	base := ready[0].Base
	suspect := func(q Queued) bool { return slices.Contains(b.Suspects, q.PullCommit) }
	var cand []Queued
	for _, q := range ready {
		if q.Base == base && (len(b.Suspects) == 0 || suspect(q)) {
			cand = append(cand, q)
		}
	}
	if len(b.Suspects) > 0 && len(cand) == 0 {
		// No suspect is ready any more: back to the whole queue.
		return Next(ready, max, Bisect{})
	}
	limit := max
	if len(b.Suspects) > 0 && b.Limit > 0 && (limit == 0 || b.Limit < limit) {
		limit = b.Limit
	}
	if limit > 0 && len(cand) > limit {
		cand = cand[:limit]
	}
	return cand
}

// Failed is what a batch's failure does: a batch of one pull ejects it
// (it fails only when squashed onto the base, or with the pulls landed
// before it) and tries the remaining suspects whole; a larger batch is
// split, its first half tried next.
func (b Bisect) Failed(batch []PullCommit, detail string) (Bisect, *Ejection) {
	if len(batch) == 1 {
		rest := slices.DeleteFunc(slices.Clone(b.Suspects), func(p PullCommit) bool { return p == batch[0] })
		next := Bisect{Suspects: rest, Limit: len(rest)}
		if len(rest) == 0 {
			next = Bisect{}
		}
		return next, &Ejection{PullCommit: batch[0], Reason: forge.EjectBatch, Detail: detail}
	}
	sus := slices.Clone(b.Suspects)
	for _, p := range batch {
		if !slices.Contains(sus, p) {
			sus = append(sus, p)
		}
	}
	return Bisect{Suspects: sus, Limit: (len(batch) + 1) / 2}, nil
}

// Landed is what a landed batch does: its pulls are no longer suspects;
// the limit stays, so the bisection goes on with the rest.
func (b Bisect) Landed(batch []PullCommit) Bisect {
	rest := slices.DeleteFunc(slices.Clone(b.Suspects), func(p PullCommit) bool { return slices.Contains(batch, p) })
	if len(rest) == 0 {
		return Bisect{}
	}
	return Bisect{Suspects: rest, Limit: min(b.Limit, len(rest))}
}

// Merge is how one pull went onto the batch being squashed, as the git
// side reports it.
type Merge struct {
	PullCommit
	// Conflicts are the conflicting paths; empty when it merged.
	Conflicts []string
	// ConflictsWithBase: it does not merge onto the base commit alone
	// either.
	ConflictsWithBase bool
	// Changed are the paths the pull's squashed commit changed (when it
	// merged).
	Changed []string
}

// Sort splits the squash's outcome into the pulls that stay in the batch
// and the ejections: a pull that does not merge onto the base conflicts
// with the base; one that merges onto the base but not onto the earlier
// pulls conflicts with the first earlier pull that changed a
// conflicting path (else with the one just before it).
func Sort(merges []Merge) ([]PullCommit, []Ejection) {
	var in []PullCommit
	var out []Ejection
	var merged []Merge
	for _, m := range merges {
		if len(m.Conflicts) == 0 {
			in = append(in, m.PullCommit)
			merged = append(merged, m)
			continue
		}
		paths := strings.Join(m.Conflicts, ", ")
		if m.ConflictsWithBase || len(merged) == 0 {
			out = append(out, Ejection{PullCommit: m.PullCommit, Reason: forge.EjectConflictBase,
				Detail: "conflicts with the base branch: " + paths})
			continue
		}
		with := merged[len(merged)-1]
	find:
		for _, e := range merged {
			for _, c := range m.Conflicts {
				if slices.Contains(e.Changed, c) {
					with = e
					break find
				}
			}
		}
		out = append(out, Ejection{PullCommit: m.PullCommit, Reason: forge.EjectConflictPull,
			Detail: fmt.Sprintf("conflicts with the earlier pull %s of the batch: %s", with.Pull, paths)})
	}
	return in, out
}

// Step is what a lander does with a batch record it finds unfinished.
type Step int

// Steps of Resume.
const (
	// Build: build (or rebuild) the batch and run its checks; the check
	// keys are the batch's, so checks already written are updated, not
	// written again.
	Build Step = iota
	// Push: the batch's checks passed; push it.
	Push
	// RecordLanding: the source already has the squashed commit: the
	// push happened, only the records are missing.
	RecordLanding
	// Rebuild: the base moved; the batch is void and its pulls go back
	// to the queue.
	Rebuild
	// Finished: the batch is landed, failed or rebuilt; nothing to do.
	Finished
)

// Resume decides what to do with batch b given the source's current
// commit of b.Ref (head) and whether b's checks all succeeded: it never
// pushes a batch twice, and never loses one that was pushed.
func Resume(b forge.Batch, head string, checksPassed bool) Step {
	switch b.Status {
	case forge.BatchLanded, forge.BatchFailed, forge.BatchRebuilt:
		return Finished
	}
	switch {
	case b.Squashed != "" && head == b.Squashed:
		return RecordLanding
	case head != b.Base:
		return Rebuild
	case b.Status == forge.BatchRunning && checksPassed:
		return Push
	}
	return Build
}

// IsLander reports whether self lands repo's queue: the one runner
// that decides it, whether or not it may push (MayPush).
func IsLander(repo *forge.Repo, self string) bool {
	return self != "" && repo.Lander() == self
}

// MayPush reports whether self may push repo's landed batches: the
// owner's landers name it. forge.Repo.Lander falls back to the first
// runner when none of landers runs the repository; that runner decides
// the queue but, not granted, ejects every entry (notLander).
func MayPush(repo *forge.Repo, self string) bool {
	return self != "" && repo.MayLand(self)
}

func short(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}
