// Package ingest finds the work of a runner on atproto: the repositories
// it serves and their pushes (dev.knotless.refUpdate) and open pulls
// (dev.knotless.pull). Listing records is the source of truth
// (Reconcile); event streams (Source) only say when to look again, so a
// gap in a stream, or a runner that was down, loses nothing.
package ingest

import (
	"context"
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

// Event is a push or a pull that may need runs.
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
}

// Key identifies the event's work: the record and its commit (a pull
// whose head moves is new work).
func (e Event) Key() string {
	if e.Preflight {
		return "preflight " + e.URI.String() + "@" + e.Commit
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
	return forge.Subject{Repo: e.Repo.URI.String(), Commit: e.Commit, Ref: e.Ref, Event: e.URI.String(), Kind: e.Kind}
}

// Branch is the branch a workflow's branches filter matches: the pushed
// branch, or the pull's base.
func (e Event) Branch() string { return strings.TrimPrefix(e.Ref, "refs/heads/") }

// Lister reconciles by listing records.
type Lister struct {
	Reader *forge.Reader
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
	Pulls  bool
	Logger *slog.Logger

	health hostHealth // failing owners' PDSes, backed off (hosts.go)

	mu sync.Mutex
	// authors are the accounts seen writing pulls.
	authors map[syntax.DID]bool
}

// Changed takes note of what an event stream saw: an account that
// writes a pull is listed for pulls from then on. Without Discover this
// is how a pull from outside the watched accounts is found; it keeps a
// poll's cost bound by the accounts that matter, not by the PDS's size.
func (l *Lister) Changed(c Change) {
	if c.Collection != forge.CollectionPull || c.DID == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.authors == nil {
		l.authors = map[syntax.DID]bool{}
	}
	l.authors[c.DID] = true
}

// Snapshot is everything a reconcile found.
type Snapshot struct {
	// Repos are the repositories listed; those whose owner's PDS failed
	// are left out (not seen, so their pushes are not taken for history).
	Repos  []forge.Record[forge.Repo]
	Events []Event
	// Hosts are the PDS hosts of the repositories' owners: the event
	// sources to follow.
	Hosts []string
}

// Reconcile lists the repositories, their pushes and (with Pulls) their
// open pulls. Events come oldest first.
func (l *Lister) Reconcile(ctx context.Context) (*Snapshot, error) {
	repos, err := l.repos(ctx)
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{}
	now := time.Now()
	hosts := map[string]bool{}
	pushes := map[syntax.DID][]forge.Record[forge.RefUpdate]{}
	landings := map[syntax.DID][]forge.Record[forge.Landing]{}
	pullsByHost := map[string][]forge.Record[forge.Pull]{}
	var pullsOfAuthors []forge.Record[forge.Pull]
	if l.Pulls && !l.Discover {
		pullsOfAuthors = l.pullsOfAuthors(ctx, repos)
	}
	for _, repo := range repos {
		owner, _ := repo.URI.Authority().AsDID()
		host, err := l.Reader.PDS(ctx, owner)
		if err != nil {
			l.Logger.Warn("owner's PDS not found; the repository is left out", "repo", repo.URI.String(), "err", err)
			continue
		}
		hosts[host] = true
		if l.health.skip(host, now) {
			continue
		}
		ups, ok := pushes[owner]
		if !ok {
			var bad []forge.Invalid
			ups, bad, err = forge.List[forge.RefUpdate](ctx, l.Reader, owner, forge.CollectionRefUpdate)
			if err != nil {
				l.health.failed(host, err, now, l.Logger)
				continue
			}
			l.warnInvalid(bad)
			pushes[owner] = ups
		}
		var pulls []forge.Record[forge.Pull]
		switch {
		case l.Pulls && !l.Discover:
			pulls = pullsOfAuthors
		case l.Pulls:
			if pulls, ok = pullsByHost[host]; !ok {
				if pulls, err = l.pullsOn(ctx, host); err != nil {
					l.health.failed(host, err, now, l.Logger)
					continue
				}
				pullsByHost[host] = pulls
			}
		}
		lands, err := l.landings(ctx, repo, landings)
		if err != nil {
			// The lander's PDS, not the owner's: the repository goes on;
			// the landings are listed again at the next reconcile.
			l.Logger.Warn("landings not listed", "repo", repo.URI.String(), "err", err)
		}
		l.health.ok(host, l.Logger)
		snap.Repos = append(snap.Repos, repo)
		snap.Events = append(snap.Events, lands...)
		for _, u := range ups {
			if u.Value.Repo != repo.URI.String() || u.Value.Deleted() {
				continue
			}
			v := u.Value
			snap.Events = append(snap.Events, Event{Kind: forge.KindPush, URI: u.URI, Repo: repo, Ref: v.Ref, Commit: v.New, Push: &v, Trusted: true})
		}
		for _, p := range pulls {
			if p.Value.Repo != repo.URI.String() || p.Value.State != forge.PullOpen {
				continue
			}
			v := p.Value
			snap.Events = append(snap.Events, Event{Kind: forge.KindPull, URI: p.URI, Repo: repo, Ref: "refs/heads/" + v.Base, Commit: v.Head.Commit, Pull: &v})
		}
	}
	for h := range hosts {
		snap.Hosts = append(snap.Hosts, h)
	}
	sort.Strings(snap.Hosts)
	sort.SliceStable(snap.Events, func(i, j int) bool {
		return snap.Events[i].URI.RecordKey().String() < snap.Events[j].URI.RecordKey().String()
	})
	return snap, nil
}

// landings are the pushes the repository's lander made from its merge
// queue (dev.knotless.landing records in the lander's repo, for this
// repository): trusted, like the owner's pushes. Only the lander the
// repo record names now counts (forge.Repo.Lander); landings of another
// runner are not work. byLander caches one listing per lander.
func (l *Lister) landings(ctx context.Context, repo forge.Record[forge.Repo], byLander map[syntax.DID][]forge.Record[forge.Landing]) ([]Event, error) {
	lander, err := syntax.ParseDID(repo.Value.Lander())
	if err != nil {
		return nil, nil
	}
	recs, ok := byLander[lander]
	if !ok {
		var bad []forge.Invalid
		recs, bad, err = forge.List[forge.Landing](ctx, l.Reader, lander, forge.CollectionLanding)
		if err != nil {
			return nil, fmt.Errorf("list the landings of %s: %w", lander, err)
		}
		l.warnInvalid(bad)
		byLander[lander] = recs
	}
	var evs []Event
	for _, r := range recs {
		v := r.Value
		if v.Repo != repo.URI.String() {
			continue
		}
		push := forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: v.Repo, Ref: v.Ref, Old: v.Old, New: v.New, CreatedAt: v.CreatedAt}
		evs = append(evs, Event{Kind: forge.KindPush, URI: r.URI, Repo: repo, Ref: v.Ref, Commit: v.New, Push: &push, Trusted: true})
	}
	return evs, nil
}

func (l *Lister) repos(ctx context.Context) ([]forge.Record[forge.Repo], error) {
	seen := map[syntax.ATURI]bool{}
	var out []forge.Record[forge.Repo]
	for _, t := range l.Targets {
		owner, err := l.resolve(ctx, t.Owner)
		if err != nil {
			return nil, fmt.Errorf("repo %s: %w", t, err)
		}
		uri := forge.RepoURI(owner, t.Name)
		var repo forge.Repo
		cid, err := l.Reader.Get(ctx, uri, &repo)
		if err != nil {
			l.Logger.Warn("watched repository unreadable", "repo", uri.String(), "err", err)
			continue
		}
		if len(repo.Runners) > 0 && !repo.NamesRunner(l.Runner.String()) {
			l.Logger.Warn("watched repository does not name this runner; skipped", "repo", uri.String())
			continue
		}
		seen[uri] = true
		out = append(out, forge.Record[forge.Repo]{URI: uri, CID: cid, Value: repo})
	}
	if !l.Discover {
		return out, nil
	}
	for _, host := range l.DiscoverHosts {
		dids, err := forge.ListRepos(ctx, l.Reader.HTTP, host)
		if err != nil {
			l.Logger.Warn("discover repositories: host failed; the named ones go on", "host", host, "err", err)
			continue
		}
		for _, did := range dids {
			recs, bad, err := forge.List[forge.Repo](ctx, l.Reader, did, forge.CollectionRepo)
			if err != nil {
				l.Logger.Warn("list repositories", "did", did.String(), "err", err)
				continue
			}
			l.warnInvalid(bad)
			for _, r := range recs {
				if seen[r.URI] || !r.Value.NamesRunner(l.Runner.String()) {
					continue
				}
				seen[r.URI] = true
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// pullsOfAuthors lists the pulls of the repositories' owners and of the
// accounts seen writing pulls.
func (l *Lister) pullsOfAuthors(ctx context.Context, repos []forge.Record[forge.Repo]) []forge.Record[forge.Pull] {
	dids := map[syntax.DID]bool{}
	for _, repo := range repos {
		owner, _ := repo.URI.Authority().AsDID()
		dids[owner] = true
	}
	l.mu.Lock()
	for did := range l.authors {
		dids[did] = true
	}
	l.mu.Unlock()
	return l.pullsOf(ctx, slices.Collect(maps.Keys(dids)))
}

// pullsOn lists the pulls of every account on host (discovery only: its
// cost grows with the host's accounts).
func (l *Lister) pullsOn(ctx context.Context, host string) ([]forge.Record[forge.Pull], error) {
	dids, err := forge.ListRepos(ctx, l.Reader.HTTP, host)
	if err != nil {
		return nil, err
	}
	return l.pullsOf(ctx, dids), nil
}

// pullsOf lists the pulls of the accounts dids; an account whose pulls
// cannot be listed is logged and passed over.
func (l *Lister) pullsOf(ctx context.Context, dids []syntax.DID) []forge.Record[forge.Pull] {
	var out []forge.Record[forge.Pull]
	for _, did := range dids {
		recs, bad, err := forge.List[forge.Pull](ctx, l.Reader, did, forge.CollectionPull)
		if err != nil {
			l.Logger.Warn("list pulls", "did", did.String(), "err", err)
			continue
		}
		l.warnInvalid(bad)
		out = append(out, recs...)
	}
	return out
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

func (l *Lister) warnInvalid(bad []forge.Invalid) {
	for _, b := range bad {
		l.Logger.Warn("record does not match its lexicon; ignored", "uri", b.URI.String(), "err", b.Err)
	}
}
