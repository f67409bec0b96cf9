package ingest

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
)

// Controls are the run-control records a reconcile listed: cancel and
// rerun records of the repositories' owners and of the accounts known
// to write pulls, dispatch records of the owners (those for the
// repositories served). Whether a record may act is intake's to decide
// (internal/rules/control): an account's records are listed, not trusted.
type Controls struct {
	Cancels    []forge.Record[forge.Cancel]
	Reruns     []forge.Record[forge.Rerun]
	Dispatches []forge.Record[forge.Dispatch]
}

// noteAuthor takes note of an account seen writing a record of one of
// collections: its pulls, cancels and re-runs are listed from then on.
func (l *Lister) noteAuthor(c Change) {
	switch c.Collection {
	case forge.CollectionPull, forge.CollectionCancel, forge.CollectionRerun:
	default:
		return
	}
	if c.DID == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.authors.init(l.MaxAuthors)
	l.authors.note(c.DID)
}

// controls are the run-control records: cancels and re-runs of the
// owners (those whose PDS listed), of the accounts seen writing pulls,
// cancels or re-runs (authors), and of the authors of the pulls listed
// (with Discover, every account on the owners' PDSes that has a pull);
// dispatches of the owners, for the repositories in repos. Most were
// listed in got's rounds; the accounts they did not cover (a pull's
// author new to the runner) are listed now. An account whose records
// do not list is logged and left out of this reconcile: a control
// record read later acts later, it is never lost.
func (l *Lister) controls(ctx context.Context, p *pool, got *listing, owners []syntax.DID, authors map[syntax.DID]bool, repos []forge.Record[forge.Repo], pulls []forge.Record[forge.Pull], now time.Time) Controls {
	acting := map[syntax.DID]bool{}
	var owning []syntax.DID
	for _, o := range owners {
		if got.owners[o].listed {
			acting[o] = true
			owning = append(owning, o)
		}
	}
	if l.Pulls {
		maps.Copy(acting, authors)
		for _, pr := range pulls {
			if did, err := pr.URI.Authority().AsDID(); err == nil {
				acting[did] = true
			}
		}
	}
	accounts := slices.Sorted(maps.Keys(acting))
	*got = l.listRound(ctx, p, *got, round{actors: accounts, dispatchers: owning}, now)
	served := map[string]bool{}
	for _, r := range repos {
		served[r.URI.String()] = true
	}
	var out Controls
	for _, a := range accounts {
		out.Cancels = append(out.Cancels, got.actions[a].cancels...)
		out.Reruns = append(out.Reruns, got.actions[a].reruns...)
	}
	for _, o := range owning {
		for _, r := range got.dispatches[o] {
			if served[r.Value.Repo] {
				out.Dispatches = append(out.Dispatches, r)
			}
		}
	}
	return out
}

// listControls lists the cancels and re-runs of actors and the
// dispatches of dispatchers, and returns what it asked, by account. An
// account whose PDS is backing off (it failed to list an owner's
// pushes) is not asked, nor an owner (in owners) whose PDS has not
// answered its last listing: a failing PDS is asked once, for the
// owner's pushes, not once for each listing (controls lists the owner's
// records once its pushes listed). A cancel is acted on whatever its
// age (its check may still be going); a rerun or a dispatch older than
// the retention never is.
func (l *Lister) listControls(ctx context.Context, p *pool, actors, dispatchers []syntax.DID, owners map[syntax.DID]bool, now time.Time) (map[syntax.DID]accountActions, map[syntax.DID][]forge.Record[forge.Dispatch]) {
	cancels := make([][]forge.Record[forge.Cancel], len(actors))
	reruns := make([][]forge.Record[forge.Rerun], len(actors))
	dispatches := make([][]forge.Record[forge.Dispatch], len(dispatchers))
	// asked[i]: task i's account was asked.
	asked := make([]bool, 2*len(actors)+len(dispatchers))
	p.each(ctx, len(asked), func(ctx context.Context, i int) {
		var did syntax.DID
		if i < 2*len(actors) {
			did = actors[i%len(actors)]
		} else {
			did = dispatchers[i-2*len(actors)]
		}
		host, err := l.Reader.PDS(ctx, did)
		if owners[did] && (err != nil || !l.hosts.hasAnswered(host)) {
			return
		}
		if err == nil && l.hosts.skip(host, now) {
			return
		}
		asked[i] = true
		switch {
		case i < len(actors):
			cancels[i] = listControl[forge.Cancel](ctx, l, did, forge.CollectionCancel, time.Time{})
		case i < 2*len(actors):
			reruns[i-len(actors)] = listControl[forge.Rerun](ctx, l, did, forge.CollectionRerun, now)
		default:
			dispatches[i-2*len(actors)] = listControl[forge.Dispatch](ctx, l, did, forge.CollectionDispatch, now)
		}
	})
	gotActions := map[syntax.DID]accountActions{}
	for i, did := range actors {
		if asked[i] && asked[len(actors)+i] {
			gotActions[did] = accountActions{cancels: cancels[i], reruns: reruns[i]}
		}
	}
	gotDispatches := map[syntax.DID][]forge.Record[forge.Dispatch]{}
	for i, did := range dispatchers {
		if asked[2*len(actors)+i] {
			gotDispatches[did] = dispatches[i]
		}
	}
	return gotActions, gotDispatches
}

// listControl lists one account's records of a run-control collection,
// all of them with a zero now, else back to the retention (listRecent);
// one that fails is logged and gives none.
func listControl[T any](ctx context.Context, l *Lister, did syntax.DID, collection string, now time.Time) []forge.Record[T] {
	var recs []forge.Record[T]
	var bad []forge.Invalid
	var err error
	if now.IsZero() {
		recs, bad, err = pdsclient.List[T](ctx, l.Reader, did, collection)
	} else {
		recs, bad, err = listRecent[T](ctx, l, did, collection, now)
	}
	if ok, err := l.usable(ctx, err); !ok {
		l.Logger.Warn("run-control records not listed; read at a later reconcile", "did", did.String(), "collection", collection, "err", err)
		return nil
	}
	l.warnInvalid(bad)
	return recs
}
