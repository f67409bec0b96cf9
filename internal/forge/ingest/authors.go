package ingest

import (
	"container/list"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// DefaultMaxAuthors is how many accounts seen writing pulls, cancels or
// re-runs the Lister remembers by default (Lister.MaxAuthors): each
// costs up to three listings a reconcile (its pulls, cancels and
// re-runs), and anyone on the owners' PDSes (or the relay) can write
// such records.
const DefaultMaxAuthors = 1000

// authorSet is the accounts an event stream showed writing pulls,
// cancels or re-runs (Lister.Changed), at most max of them. Those the
// last listing found with an open pull for a repository served
// (confirm) go out last: past max, the oldest noted account that has
// none goes, so a flood of strangers' records, each from a new
// account, costs at most max accounts' listings a reconcile and pushes
// out the authors of the pulls served only once it has pushed out
// every stranger. The Lister's lock guards it.
type authorSet struct {
	max int
	// fresh are the accounts noted but not confirmed, known the
	// confirmed ones, each newest first.
	fresh, known list.List
	at           map[syntax.DID]*list.Element
}

// author is an element's value.
type author struct {
	did   syntax.DID
	known bool
}

func (s *authorSet) init(max int) {
	if s.at != nil {
		return
	}
	if max <= 0 {
		max = DefaultMaxAuthors
	}
	s.max, s.at = max, map[syntax.DID]*list.Element{}
	s.fresh.Init()
	s.known.Init()
}

// note takes note of an account seen writing: the newest of its tier,
// a new one the newest of the fresh, and the oldest past max forgotten.
func (s *authorSet) note(did syntax.DID) {
	if e, ok := s.at[did]; ok {
		s.tier(e).MoveToFront(e)
		return
	}
	s.at[did] = s.fresh.PushFront(&author{did: did})
	for len(s.at) > s.max {
		oldest := s.fresh.Back()
		if oldest == nil {
			oldest = s.known.Back()
		}
		delete(s.at, oldest.Value.(*author).did)
		s.tier(oldest).Remove(oldest)
	}
}

// confirm moves the accounts of dids it holds to the front of the
// confirmed ones: a listing found an open pull of theirs for a
// repository served.
func (s *authorSet) confirm(dids []syntax.DID) {
	for _, did := range dids {
		e, ok := s.at[did]
		if !ok {
			continue
		}
		a := e.Value.(*author)
		if a.known {
			s.known.MoveToFront(e)
			continue
		}
		s.fresh.Remove(e)
		a.known = true
		s.at[did] = s.known.PushFront(a)
	}
}

func (s *authorSet) tier(e *list.Element) *list.List {
	if e.Value.(*author).known {
		return &s.known
	}
	return &s.fresh
}

// all are the accounts held.
func (s *authorSet) all() map[syntax.DID]bool {
	out := make(map[syntax.DID]bool, len(s.at))
	for did := range s.at {
		out[did] = true
	}
	return out
}
