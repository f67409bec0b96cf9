// Package ingest finds the work of a runner on atproto: the repositories
// it serves and their pushes (dev.knotless.refUpdate) and open pulls
// (dev.knotless.pull). Listing records is the source of truth
// (Reconcile); event streams (Source) only say when to look again, so a
// gap in a stream, or a runner that was down, loses nothing.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/rules/work"
)

// Target is a repository named on the command line.
type Target struct {
	Owner syntax.AtIdentifier
	Name  string
}

func (t Target) String() string { return t.Owner.String() + "/" + t.Name }

// ParseTarget reads a REPO argument: an AT-URI of a dev.knotless.repo
// record, or OWNER/NAME where OWNER is a DID or a handle.
func ParseTarget(s string) (Target, error) {
	if strings.HasPrefix(s, "at://") {
		uri, err := syntax.ParseATURI(s)
		if err != nil {
			return Target{}, fmt.Errorf("repo %q: %w", s, err)
		}
		if uri.Collection() != forge.CollectionRepo || uri.RecordKey() == "" {
			return Target{}, fmt.Errorf("repo %q: want an AT-URI of a %s record", s, forge.CollectionRepo)
		}
		return Target{Owner: uri.Authority(), Name: uri.RecordKey().String()}, nil
	}
	owner, name, ok := strings.Cut(s, "/")
	if !ok || name == "" || strings.Contains(name, "/") {
		return Target{}, fmt.Errorf("repo %q: want at://OWNER/%s/NAME or OWNER/NAME", s, forge.CollectionRepo)
	}
	id, err := syntax.ParseAtIdentifier(owner)
	if err != nil {
		return Target{}, fmt.Errorf("repo %q: owner: %w", s, err)
	}
	if _, err := syntax.ParseRecordKey(name); err != nil {
		return Target{}, fmt.Errorf("repo %q: name: %w", s, err)
	}
	return Target{Owner: id, Name: name}, nil
}

// Lister reconciles by listing records.
type Lister struct {
	Reader *pdsclient.Reader
	Dir    identity.Directory
	// Runner is this runner's DID.
	Runner syntax.DID
	// Targets are the repositories named on the command line.
	Targets []Target
	// Discover adds every repository that names the runner, found on
	// DiscoverHosts (the runner's PDS, or a relay).
	Discover      bool
	DiscoverHosts []string
	// Pulls lists open pulls too: with Discover, from every account on
	// the owners' PDSes; otherwise from the owners and the accounts an
	// event stream showed writing a pull (Changed).
	Pulls bool
	// Bounds run the listings in parallel, each under a deadline, so
	// that one slow or hostile PDS does not hold the others (bounds.go).
	Bounds Bounds
	// Retention is the age past which a push, a rerun or a dispatch is
	// never acted on (the intake's): their listings, newest first, stop
	// at it, so a long history costs no pages. 0 lists them all.
	Retention time.Duration
	// MaxAuthors bounds the accounts seen writing pulls, cancels or
	// re-runs that are listed for them (Changed; 0: DefaultMaxAuthors).
	MaxAuthors int
	Logger     *slog.Logger

	// hosts are the failing owners' PDSes, accounts the accounts whose
	// pulls failed to list: both backed off (hosts.go).
	hosts, accounts backoffs

	mu sync.Mutex
	// authors are the accounts seen writing pulls, cancels or re-runs
	// (authors.go).
	authors authorSet
}

// Changed takes note of what an event stream saw: an account that
// writes a pull is listed for pulls from then on. Without Discover this
// is how a pull from outside the watched accounts is found; it keeps a
// poll's cost bound by the accounts that matter, not by the PDS's size.
// An account that writes a cancel or a rerun is listed for those too
// (control.go).
func (l *Lister) Changed(c Change) { l.noteAuthor(c) }

// Snapshot is everything a reconcile found.
type Snapshot struct {
	// Repos are the repositories listed; those whose owner's PDS failed
	// are left out (not seen, so their pushes are not taken for history).
	Repos []forge.Record[forge.Repo]
	// Complete is true when no listing of the repositories failed: every
	// watched record read (or found gone), every discovery host and
	// account listed, every owner's PDS answered. Then a repository not
	// in Repos is not served, and what is kept of it may be forgotten;
	// never after a listing that failed in part.
	Complete bool
	Events   []work.Event
	// Controls are the run-control records listed (control.go).
	Controls Controls
	// Hosts are the PDS hosts of the repositories' owners: the event
	// sources to follow.
	Hosts []string
}

// ownerListing is what a reconcile read from one owner's PDS.
type ownerListing struct {
	host   string // "" when the owner's PDS is not known
	listed bool   // false: the host failed or is backing off
	pushes []forge.Record[forge.RefUpdate]
	pulls  []forge.Record[forge.Pull] // with Discover: every account's on host
}

// Reconcile lists the repositories, their pushes and (with Pulls) their
// open pulls. Events come oldest first. Every PDS is listed apart, in
// parallel and under a deadline (Bounds): one that is slow, fails or
// pages forever leaves its own repositories (or pulls) out, not the
// others'.
//
// A reconcile is on the path of every push, so its listings go in as
// few rounds as what each needs allows (rounds.go): the owners of the
// repositories named by DID are known before their records are read,
// so their pushes, pulls and run-control records are listed beside
// those reads. Only what a read tells (a discovered or handle-named
// owner, a lander, a pull's author) waits for it.
func (l *Lister) Reconcile(ctx context.Context) (*Snapshot, error) {
	start := time.Now()
	p := l.Bounds.pool()
	now := time.Now()
	authors := l.knownAuthors()
	var got listing
	var repos []forge.Record[forge.Repo]
	var reposComplete bool
	var reposErr error
	var wg sync.WaitGroup
	wg.Go(func() { repos, reposComplete, reposErr = l.repos(ctx, p) })
	named := l.namedOwners()
	wg.Go(func() { got = l.listRound(ctx, p, listing{}, l.roundOf(named, authors), now) })
	wg.Wait()
	if reposErr != nil {
		return nil, reposErr
	}
	owners := ownersOf(repos)
	var landings map[syntax.ATURI][]work.Event
	wg.Go(func() { landings = l.landings(ctx, p, repos) })
	got = l.listRound(ctx, p, got, l.roundOf(owners, authors), now)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	var pullsOfAuthors []forge.Record[forge.Pull]
	if l.Pulls && !l.Discover {
		pullsOfAuthors = got.pullsOf(slices.Sorted(maps.Keys(union(owners, authors))))
	}
	snap := &Snapshot{Complete: reposComplete}
	hosts := map[string]bool{}
	for _, repo := range repos {
		owner, _ := repo.URI.Authority().AsDID()
		o := got.owners[owner]
		if o.host == "" {
			snap.Complete = false
			continue
		}
		hosts[o.host] = true
		if !o.listed {
			snap.Complete = false
			continue
		}
		pulls := o.pulls
		if l.Pulls && !l.Discover {
			pulls = pullsOfAuthors
		}
		snap.Repos = append(snap.Repos, repo)
		snap.Events = append(snap.Events, landings[repo.URI]...)
		for _, u := range o.pushes {
			if u.Value.Repo != repo.URI.String() || u.Value.Deleted() {
				continue
			}
			v := u.Value
			snap.Events = append(snap.Events, work.Event{Kind: forge.KindPush, URI: u.URI, Repo: repo, Ref: v.Ref, Commit: v.New, Push: &v, Trusted: true})
		}
		for _, p := range pulls {
			if p.Value.Repo != repo.URI.String() || p.Value.State != forge.PullOpen {
				continue
			}
			v := p.Value
			snap.Events = append(snap.Events, work.Event{Kind: forge.KindPull, URI: p.URI, Repo: repo, Ref: "refs/heads/" + v.Base, Commit: v.Head.Commit, Pull: &v})
		}
	}
	for h := range hosts {
		snap.Hosts = append(snap.Hosts, h)
	}
	sort.Strings(snap.Hosts)
	var allPulls []forge.Record[forge.Pull]
	for _, o := range owners {
		allPulls = append(allPulls, got.owners[o].pulls...)
	}
	snap.Controls = l.controls(ctx, p, &got, owners, authors, snap.Repos, append(allPulls, pullsOfAuthors...), now)
	sort.SliceStable(snap.Events, func(i, j int) bool {
		return snap.Events[i].URI.RecordKey().String() < snap.Events[j].URI.RecordKey().String()
	})
	l.confirmAuthors(snap)
	l.Logger.Debug("listed", "repos", len(snap.Repos), "of", len(repos), "events", len(snap.Events), "took", time.Since(start))
	return snap, nil
}

// ownersOf lists the repositories' owners, each once, in the order of
// the repositories.
func ownersOf(repos []forge.Record[forge.Repo]) []syntax.DID {
	var owners []syntax.DID
	seen := map[syntax.DID]bool{}
	for _, repo := range repos {
		owner, _ := repo.URI.Authority().AsDID()
		if !seen[owner] {
			seen[owner] = true
			owners = append(owners, owner)
		}
	}
	return owners
}

// listOwners reads each owner's pushes from its PDS and, with Discover
// and Pulls, the pulls of every account on that PDS (those of a host in
// done, listed in an earlier round, are not listed again; the hosts
// listed now are returned). A PDS that fails, or passes the deadline,
// is logged and backed off, and its owners' repositories are left out
// meanwhile; the others go on.
func (l *Lister) listOwners(ctx context.Context, p *pool, owners []syntax.DID, done map[string]hostPulls, now time.Time) ([]ownerListing, map[string]hostPulls) {
	out := make([]ownerListing, len(owners))
	p.each(ctx, len(owners), func(ctx context.Context, i int) {
		owner := owners[i]
		host, err := l.Reader.PDS(ctx, owner)
		if err != nil {
			l.Logger.Warn("owner's PDS not found; its repositories are left out", "owner", owner.String(), "err", err)
			return
		}
		out[i].host = host
		if l.hosts.skip(host, now) {
			return
		}
		ups, bad, err := listRecent[forge.RefUpdate](ctx, l, owner, forge.CollectionRefUpdate, now)
		if ok, err := l.usable(ctx, err); !ok {
			l.hostFailed(host, err, now)
			return
		}
		l.warnInvalid(bad)
		out[i].pushes, out[i].listed = ups, true
	})
	var onHosts map[string]hostPulls
	if l.Pulls && l.Discover {
		onHosts = l.pullsOnHosts(ctx, p, out, done, now)
	}
	for _, o := range out {
		// A host that failed in this reconcile (for another of its
		// owners) stays backed off.
		if o.listed && !l.hosts.skip(o.host, now) {
			if n := l.hosts.ok(o.host); n > 0 {
				l.Logger.Info("owner's PDS answers again", "host", o.host, "after_failures", n)
			}
		}
	}
	return out, onHosts
}

// listRecent lists a collection of did whose records (keyed by TID)
// are never acted on once older than the retention: only back to the
// retention when one is set (Lister.Retention).
func listRecent[T any](ctx context.Context, l *Lister, did syntax.DID, collection string, now time.Time) ([]forge.Record[T], []forge.Invalid, error) {
	if l.Retention > 0 {
		return pdsclient.ListSince[T](ctx, l.Reader, did, collection, now.Add(-l.Retention))
	}
	return pdsclient.List[T](ctx, l.Reader, did, collection)
}

func (l *Lister) hostFailed(host string, err error, now time.Time) {
	n, wait := l.hosts.failed(host, now)
	l.Logger.Warn("owner's PDS failed; its repositories are left out until it answers, the others go on", "host", host, "failures", n, "retry_in", wait, "err", err)
}

// hostPulls are the pulls of every account on one host (Discover with
// Pulls); ok is false when the host's accounts could not be listed.
type hostPulls struct {
	pulls []forge.Record[forge.Pull]
	ok    bool
}

// pullsOnHosts lists the pulls of every account on each listed owner's
// PDS (discovery: its cost grows with the hosts' accounts, by choice),
// but for the hosts in done. A host whose accounts cannot be listed
// fails like its owners' pushes. It returns the hosts it listed.
func (l *Lister) pullsOnHosts(ctx context.Context, p *pool, owners []ownerListing, done map[string]hostPulls, now time.Time) map[string]hostPulls {
	var hosts []string
	seen := map[string]bool{}
	for _, o := range owners {
		if _, before := done[o.host]; o.listed && !seen[o.host] && !before {
			seen[o.host] = true
			hosts = append(hosts, o.host)
		}
	}
	dids := make([][]syntax.DID, len(hosts))
	failed := make([]bool, len(hosts))
	p.each(ctx, len(hosts), func(ctx context.Context, i int) {
		var err error
		dids[i], err = pdsclient.ListRepos(ctx, l.Reader.HTTP, hosts[i], l.Reader.Limits)
		if ok, err := l.usable(ctx, err); !ok {
			l.hostFailed(hosts[i], err, now)
			failed[i] = true
		}
	})
	found := map[string]hostPulls{}
	for i, h := range hosts {
		if failed[i] {
			found[h] = hostPulls{}
			continue
		}
		found[h] = hostPulls{pulls: slices.Concat(l.pullsOf(ctx, p, dids[i], now)...), ok: true}
	}
	for i := range owners {
		if !owners[i].listed {
			continue
		}
		on, ok := found[owners[i].host]
		if !ok {
			on = done[owners[i].host]
		}
		owners[i].pulls, owners[i].listed = on.pulls, on.ok
	}
	return found
}

// landings lists, per repository, the pushes its lander made from its
// merge queue (dev.knotless.landing records in the lander's repo, for
// that repository): trusted, like the owner's pushes. Only the lander
// the repo record names now counts (forge.Repo.Lander), and only when
// the owner granted it (forge.Repo.MayLand: a fallback lander that
// landers does not name pushes nothing, so its landing records are a
// stranger's claims); landings of another runner are not work. Each lander is listed once; one that
// fails is logged and its landings are listed again at the next
// reconcile, while its repositories go on.
func (l *Lister) landings(ctx context.Context, p *pool, repos []forge.Record[forge.Repo]) map[syntax.ATURI][]work.Event {
	var landers []syntax.DID
	seen := map[syntax.DID]bool{}
	for _, repo := range repos {
		if !repo.Value.MayLand(repo.Value.Lander()) {
			continue // a fallback lander, not granted: it pushes nothing
		}
		if lander, err := syntax.ParseDID(repo.Value.Lander()); err == nil && !seen[lander] {
			seen[lander] = true
			landers = append(landers, lander)
		}
	}
	recs := make([][]forge.Record[forge.Landing], len(landers))
	p.each(ctx, len(landers), func(ctx context.Context, i int) {
		r, bad, err := pdsclient.List[forge.Landing](ctx, l.Reader, landers[i], forge.CollectionLanding)
		if ok, err := l.usable(ctx, err); !ok {
			l.Logger.Warn("landings not listed; their repositories go on", "lander", landers[i].String(), "err", err)
			return
		}
		l.warnInvalid(bad)
		recs[i] = r
	})
	byLander := map[syntax.DID][]forge.Record[forge.Landing]{}
	for i, lander := range landers {
		byLander[lander] = recs[i]
	}
	out := map[syntax.ATURI][]work.Event{}
	for _, repo := range repos {
		lander, err := syntax.ParseDID(repo.Value.Lander())
		if err != nil || !repo.Value.MayLand(lander.String()) {
			continue
		}
		for _, r := range byLander[lander] {
			v := r.Value
			if v.Repo != repo.URI.String() {
				continue
			}
			push := forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: v.Repo, Ref: v.Ref, Old: v.Old, New: v.New, CreatedAt: v.CreatedAt}
			out[repo.URI] = append(out[repo.URI], work.Event{Kind: forge.KindPush, URI: r.URI, Repo: repo, Ref: v.Ref, Commit: v.New, Push: &push, Trusted: true})
		}
	}
	return out
}

// repos reads the watched repositories' records and, with Discover, the
// repositories of every account on the discovery hosts that name the
// runner; each account's PDS is read apart, under the Bounds. complete
// is false when a read or a listing failed (a watched record that is
// gone is no failure: it is not served).
func (l *Lister) repos(ctx context.Context, p *pool) (_ []forge.Record[forge.Repo], complete bool, _ error) {
	type read struct {
		rec    forge.Record[forge.Repo]
		ok     bool
		unread bool  // the record did not read (but for one that is gone)
		fail   error // the target's owner does not resolve: the reconcile fails
	}
	reads := make([]read, len(l.Targets))
	p.each(ctx, len(l.Targets), func(ctx context.Context, i int) {
		t := l.Targets[i]
		owner, err := l.resolve(ctx, t.Owner)
		if err != nil {
			reads[i].fail = fmt.Errorf("repo %s: %w", t, err)
			return
		}
		uri := forge.RepoURI(owner, t.Name)
		var repo forge.Repo
		cid, err := l.Reader.Get(ctx, uri, &repo)
		if _, err := l.usable(ctx, err); err != nil {
			l.Logger.Warn("watched repository unreadable", "repo", uri.String(), "err", err)
			reads[i].unread = !errors.Is(err, pdsclient.ErrNotFound)
			return
		}
		if len(repo.Runners) > 0 && !repo.NamesRunner(l.Runner.String()) {
			l.Logger.Warn("watched repository does not name this runner; skipped", "repo", uri.String())
			return
		}
		reads[i] = read{rec: forge.Record[forge.Repo]{URI: uri, CID: cid, Value: repo}, ok: true}
	})
	seen := map[syntax.ATURI]bool{}
	var out []forge.Record[forge.Repo]
	complete = !slices.ContainsFunc(reads, func(r read) bool { return r.unread })
	for _, r := range reads {
		if r.fail != nil {
			return nil, false, r.fail
		}
		if r.ok && !seen[r.rec.URI] {
			seen[r.rec.URI] = true
			out = append(out, r.rec)
		}
	}
	if !l.Discover {
		return out, complete, nil
	}
	for _, host := range l.DiscoverHosts {
		var dids []syntax.DID
		p.each(ctx, 1, func(ctx context.Context, _ int) {
			var err error
			dids, err = pdsclient.ListRepos(ctx, l.Reader.HTTP, host, l.Reader.Limits)
			if ok, err := l.usable(ctx, err); !ok {
				l.Logger.Warn("discover repositories: host failed; the named ones go on", "host", host, "err", err)
				complete = false
			}
		})
		found := make([][]forge.Record[forge.Repo], len(dids))
		failed := make([]bool, len(dids))
		p.each(ctx, len(dids), func(ctx context.Context, i int) {
			recs, bad, err := pdsclient.List[forge.Repo](ctx, l.Reader, dids[i], forge.CollectionRepo)
			if ok, err := l.usable(ctx, err); !ok {
				l.Logger.Warn("list repositories", "did", dids[i].String(), "err", err)
				failed[i] = true
				return
			}
			l.warnInvalid(bad)
			found[i] = recs
		})
		if slices.Contains(failed, true) {
			complete = false
		}
		for _, recs := range found {
			for _, r := range recs {
				if seen[r.URI] || !r.Value.NamesRunner(l.Runner.String()) {
					continue
				}
				seen[r.URI] = true
				out = append(out, r)
			}
		}
	}
	return out, complete, nil
}

// pullsOf lists the pulls of the accounts dids, each under the Bounds,
// at each one's index; an account whose pulls cannot be listed (or not
// within the deadline) is logged, passed over and backed off (by
// account: its PDS may serve others), while the others go on.
func (l *Lister) pullsOf(ctx context.Context, p *pool, dids []syntax.DID, now time.Time) [][]forge.Record[forge.Pull] {
	found := make([][]forge.Record[forge.Pull], len(dids))
	p.each(ctx, len(dids), func(ctx context.Context, i int) {
		did := dids[i].String()
		if l.accounts.skip(did, now) {
			return
		}
		recs, bad, err := pdsclient.List[forge.Pull](ctx, l.Reader, dids[i], forge.CollectionPull)
		if ok, err := l.usable(ctx, err); !ok {
			n, wait := l.accounts.failed(did, now)
			l.Logger.Warn("pulls of an account not listed; it is passed over, the others go on", "did", did, "failures", n, "retry_in", wait, "err", err)
			return
		}
		l.accounts.ok(did)
		l.warnInvalid(bad)
		found[i] = recs
	})
	return found
}

func (l *Lister) resolve(ctx context.Context, id syntax.AtIdentifier) (syntax.DID, error) {
	if did, err := id.AsDID(); err == nil {
		return did, nil
	}
	h, _ := id.AsHandle()
	ident, err := l.Dir.LookupHandle(ctx, h)
	if err != nil {
		return "", fmt.Errorf("resolve handle %s: %w", h, err)
	}
	return ident.DID, nil
}

// maxInvalidLogged is how many invalid records of one listing are
// logged one by one; the rest are counted, so that a PDS listing
// thousands of them does not flood the log.
const maxInvalidLogged = 5

func (l *Lister) warnInvalid(bad []forge.Invalid) {
	for i, b := range bad {
		if i == maxInvalidLogged {
			l.Logger.Warn("more records do not match their lexicon; ignored", "more", len(bad)-i, "first_uri", b.URI.String())
			return
		}
		l.Logger.Warn("record does not match its lexicon; ignored", "uri", b.URI.String(), "err", b.Err)
	}
}
