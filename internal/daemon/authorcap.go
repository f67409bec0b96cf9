package daemon

import (
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
)

// The per-author caps (flood.go): one stranger's pull spam must not
// fill the queue ahead of the owner's pushes, nor spend the runner's
// PDS write quota. See docs/design/daemon.md, "The queue" and "Floods".

// author is whom the author caps count an event against: the account
// that wrote an untrusted pull (its record's); with all (the limits
// apply to all runs: --limits-apply-to all), also the owner of a
// pushed repository. "" for work never capped by author: a trusted
// push by default, and a merge-queue batch (the owner queued its
// pulls; --queue-batch bounds it).
func author(ev ingest.Event, all bool) string {
	switch {
	case ev.Kind == forge.KindBatch:
		return ""
	case ev.Trusted && all:
		return ev.Repo.URI.Authority().String()
	case ev.Trusted:
		return ""
	}
	return ev.URI.Authority().String()
}

// checkAuthor is whom a check write is counted against, as author
// counts its event: a pull's check against the pull's author, with all
// a push's against the repository's owner.
func checkAuthor(c forge.Check, all bool) string {
	switch {
	case c.Subject.Kind == forge.KindPull:
		return syntax.ATURI(c.Subject.Event).Authority().String()
	case c.Subject.Kind == forge.KindPush && all:
		return syntax.ATURI(c.Subject.Repo).Authority().String()
	}
	return ""
}

// load is what author a has in hand, as the caps count it (flood.go):
// its runs queued or running, but those ev supersedes (it takes their
// place), and the check writes they all still owe.
func (q *queue) load(a string, all bool, ev ingest.Event) (runs, owing int) {
	count := func(j *job, writes int) {
		if author(j.ev, all) != a {
			return
		}
		owing += writes
		if !supersededBy(j, ev) {
			runs++
		}
	}
	for _, j := range q.waiting {
		count(j, 2) // running, final
	}
	for _, j := range q.running {
		count(j, 1) // final
	}
	return runs, owing
}

// supersededBy reports whether ev supersedes j's run (queue.add): a
// newer commit of the same pull, or a newer push of the same ref,
// unless j's workflow lets its older runs finish.
func supersededBy(j *job, ev ingest.Event) bool {
	if j.wf != nil && j.wf.Superseded == "finish" {
		return false
	}
	switch ev.Kind {
	case forge.KindPull:
		return j.ev.Kind == forge.KindPull && j.ev.URI == ev.URI && j.ev.Commit != ev.Commit
	case forge.KindPush:
		return j.ev.Kind == forge.KindPush && j.ev.Repo.URI == ev.Repo.URI && j.ev.Ref == ev.Ref &&
			j.ev.URI.RecordKey().String() < ev.URI.RecordKey().String()
	}
	return false
}

// claimIndex is the queued job a worker takes next: the first trusted
// one (the owner's pushes go ahead of strangers' pulls), else the first.
func claimIndex(queue []*job) int {
	for i, j := range queue {
		if j.ev.Trusted {
			return i
		}
	}
	return 0
}
