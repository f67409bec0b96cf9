package ingest

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
)

// listing is what a reconcile listed, by account, filled in rounds
// (Reconcile): an account listed in one round is not listed again in
// the next.
type listing struct {
	// owners are the repositories' owners' pushes (and, with Discover
	// and Pulls, the pulls on their hosts).
	owners map[syntax.DID]ownerListing
	// hosts are, with Discover and Pulls, the pulls of every account on
	// each owner's host.
	hosts map[string]hostPulls
	// pulls are, with Pulls and without Discover, the pulls of the
	// owners and of the accounts seen writing pulls.
	pulls map[syntax.DID][]forge.Record[forge.Pull]
	// actions are the cancels and re-runs of the accounts that may act
	// on runs, dispatches the dispatch records of the owners.
	actions    map[syntax.DID]accountActions
	dispatches map[syntax.DID][]forge.Record[forge.Dispatch]
}

// accountActions are one account's cancel and rerun records.
type accountActions struct {
	cancels []forge.Record[forge.Cancel]
	reruns  []forge.Record[forge.Rerun]
}

// round is what one round lists: the pushes of owners, the pulls of
// pullers, the cancels and re-runs of actors, the dispatches of
// dispatchers.
type round struct {
	owners, pullers, actors, dispatchers []syntax.DID
}

// roundOf is the round that lists what a reconcile needs of owners:
// with Pulls, the accounts seen writing pulls, cancels or re-runs
// (authors) go beside them.
func (l *Lister) roundOf(owners []syntax.DID, authors map[syntax.DID]bool) round {
	r := round{owners: owners, actors: owners, dispatchers: owners}
	if l.Pulls {
		r.actors = slices.Sorted(maps.Keys(union(owners, authors)))
		if !l.Discover {
			r.pullers = r.actors
		}
	}
	return r
}

// listRound lists r, but for what got holds already, all at once under
// the pool, and returns got with it.
func (l *Lister) listRound(ctx context.Context, p *pool, got listing, r round, now time.Time) listing {
	if got.owners == nil {
		got = listing{owners: map[syntax.DID]ownerListing{}, hosts: map[string]hostPulls{},
			pulls: map[syntax.DID][]forge.Record[forge.Pull]{}, actions: map[syntax.DID]accountActions{},
			dispatches: map[syntax.DID][]forge.Record[forge.Dispatch]{}}
	}
	owners, pullers := missing(r.owners, got.owners), missing(r.pullers, got.pulls)
	actors, dispatchers := missing(r.actors, got.actions), missing(r.dispatchers, got.dispatches)
	var (
		listed     []ownerListing
		onHosts    map[string]hostPulls
		pulls      [][]forge.Record[forge.Pull]
		actions    map[syntax.DID]accountActions
		dispatches map[syntax.DID][]forge.Record[forge.Dispatch]
		wg         sync.WaitGroup
	)
	wg.Go(func() { listed, onHosts = l.listOwners(ctx, p, owners, got.hosts, now) })
	wg.Go(func() { pulls = l.pullsOf(ctx, p, pullers, now) })
	isOwner := union(r.owners, nil)
	wg.Go(func() { actions, dispatches = l.listControls(ctx, p, actors, dispatchers, isOwner, now) })
	wg.Wait()
	for i, o := range owners {
		got.owners[o] = listed[i]
	}
	maps.Copy(got.hosts, onHosts)
	for i, did := range pullers {
		got.pulls[did] = pulls[i]
	}
	maps.Copy(got.actions, actions)
	maps.Copy(got.dispatches, dispatches)
	return got
}

// pullsOf are the pulls listed of dids, in their order.
func (g listing) pullsOf(dids []syntax.DID) []forge.Record[forge.Pull] {
	var out []forge.Record[forge.Pull]
	for _, did := range dids {
		out = append(out, g.pulls[did]...)
	}
	return out
}

// namedOwners are the owners of the repositories named by DID, known
// before any record is read (a handle is resolved with its repository's
// read).
func (l *Lister) namedOwners() []syntax.DID {
	var owners []syntax.DID
	for _, t := range l.Targets {
		if did, err := t.Owner.AsDID(); err == nil && !slices.Contains(owners, did) {
			owners = append(owners, did)
		}
	}
	return owners
}

// knownAuthors are the accounts an event stream showed writing pulls,
// cancels or re-runs (Changed), at most MaxAuthors.
func (l *Lister) knownAuthors() map[syntax.DID]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.authors.init(l.MaxAuthors)
	return l.authors.all()
}

// confirmAuthors keeps the authors of the open pulls for the
// repositories served (snap's) longer than the other accounts noted.
func (l *Lister) confirmAuthors(snap *Snapshot) {
	var dids []syntax.DID
	for _, ev := range snap.Events {
		if ev.Kind != forge.KindPull {
			continue
		}
		if did, err := ev.URI.Authority().AsDID(); err == nil {
			dids = append(dids, did)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.authors.init(l.MaxAuthors)
	l.authors.confirm(dids)
}

// missing are the dids that m has no entry for.
func missing[V any](dids []syntax.DID, m map[syntax.DID]V) []syntax.DID {
	var out []syntax.DID
	for _, did := range dids {
		if _, ok := m[did]; !ok {
			out = append(out, did)
		}
	}
	return out
}

func union(dids []syntax.DID, more map[syntax.DID]bool) map[syntax.DID]bool {
	out := maps.Clone(more)
	if out == nil {
		out = map[syntax.DID]bool{}
	}
	for _, did := range dids {
		out[did] = true
	}
	return out
}
