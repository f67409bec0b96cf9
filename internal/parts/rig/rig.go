// Package rig is the outside world of the daemon's parts in memory, for
// the -short tests: the listing of the watched repositories (Lister),
// the git mirrors and the source behind them (Mirrors: a small commit
// model with squashes, conflicts by path and a push with a lease), the
// runner's check records (PDS), its blobs (Blobs), the owners' sealed
// secrets (Sealed) and the merge queue's records (Queue, validated
// against the lexicons). With fakeexec for the executor, each part is
// driven alone and the whole daemon through serve, with no server, git
// or process. The real-PDS tests cover the same ground end to end.
package rig

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// The rig's accounts and repository.
const (
	Runner = "did:plc:runner"
	Owner  = "did:plc:owner"
	Source = "https://git.test/owner/r"
	Repo   = "at://" + Owner + "/" + forge.CollectionRepo + "/r"
)

// ErrDown is a PDS or source that does not answer.
var ErrDown = errors.New("connection refused")

// RepoRecord is the rig's repository.
func RepoRecord() forge.Record[forge.Repo] {
	return forge.Record[forge.Repo]{URI: syntax.ATURI(Repo), Value: forge.Repo{Name: "r", Source: Source}}
}

// OtherRepo is a second repository of the owner, named name.
func OtherRepo(name string) forge.Record[forge.Repo] {
	return forge.Record[forge.Repo]{URI: syntax.ATURI("at://" + Owner + "/" + forge.CollectionRepo + "/" + name),
		Value: forge.Repo{Name: name, Source: "https://git.test/owner/" + name}}
}

// QueueRepo is the rig's repository naming runners, of which landers
// may push.
func QueueRepo(runners, landers []string) forge.Record[forge.Repo] {
	r := RepoRecord()
	r.Value.Runners, r.Value.Landers = runners, landers
	return r
}

// Push is a push by the owner to main of the rig's repository.
func Push(rkey, commit string) work.Event {
	return work.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://" + Owner + "/" + forge.CollectionRefUpdate + "/" + rkey),
		Repo: RepoRecord(), Ref: "refs/heads/main", Commit: commit, Trusted: true}
}

// Pull is a pull by author onto main of the rig's repository.
func Pull(author, rkey, commit string) work.Event {
	return work.Event{Kind: forge.KindPull, URI: syntax.ATURI("at://" + author + "/" + forge.CollectionPull + "/" + rkey),
		Repo: RepoRecord(), Ref: "refs/heads/main", Commit: commit,
		Pull: &forge.Pull{Base: "main", Head: forge.PullHead{Source: "https://git.test/" + author + "/fork", Ref: "topic"}}}
}

// CI is a workflow that runs on pushes and pulls: one step per script.
func CI(name string, scripts ...string) *workflow.Workflow {
	wf := &workflow.Workflow{Name: name, File: ".knotless/workflows/" + name + ".yaml", On: []workflow.Trigger{workflow.Push, workflow.Pull}}
	for i, s := range scripts {
		wf.Steps = append(wf.Steps, workflow.Step{Name: name + "-" + string(rune('a'+i)), Run: s})
	}
	return wf
}

// Lister answers Reconcile with the events set, and lists their
// repositories and the repositories set (ingest.Lister).
type Lister struct {
	mu       sync.Mutex
	events   []work.Event
	repos    []forge.Record[forge.Repo]
	controls ingest.Controls
	err      error
	changes  []ingest.Change
}

// SetControls makes c the run-control records listed.
func (l *Lister) SetControls(c ingest.Controls) {
	l.mu.Lock()
	l.controls = c
	l.mu.Unlock()
}

// AddControls lists more run-control records.
func (l *Lister) AddControls(c ingest.Controls) {
	l.mu.Lock()
	l.controls.Cancels = append(l.controls.Cancels, c.Cancels...)
	l.controls.Reruns = append(l.controls.Reruns, c.Reruns...)
	l.controls.Dispatches = append(l.controls.Dispatches, c.Dispatches...)
	l.mu.Unlock()
}

// Set makes evs the events listed.
func (l *Lister) Set(evs ...work.Event) {
	l.mu.Lock()
	l.events = evs
	l.mu.Unlock()
}

// SetRepos lists repos besides the events' repositories.
func (l *Lister) SetRepos(repos ...forge.Record[forge.Repo]) {
	l.mu.Lock()
	l.repos = repos
	l.mu.Unlock()
}

// Fail makes Reconcile fail with err (nil: answer again).
func (l *Lister) Fail(err error) {
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
}

// Changes are the changes the lister was told of.
func (l *Lister) Changes() []ingest.Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.changes)
}

// Reconcile lists the events set and their repositories.
func (l *Lister) Reconcile(context.Context) (*ingest.Snapshot, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return nil, l.err
	}
	snap := &ingest.Snapshot{Events: slices.Clone(l.events), Hosts: []string{"http://127.0.0.1:1"}, Controls: ingest.Controls{
		Cancels: slices.Clone(l.controls.Cancels), Reruns: slices.Clone(l.controls.Reruns), Dispatches: slices.Clone(l.controls.Dispatches)}}
	seen := map[syntax.ATURI]bool{}
	for _, ev := range l.events {
		if !seen[ev.Repo.URI] {
			seen[ev.Repo.URI] = true
			snap.Repos = append(snap.Repos, ev.Repo)
		}
	}
	for _, repo := range l.repos {
		if !seen[repo.URI] {
			seen[repo.URI] = true
			snap.Repos = append(snap.Repos, repo)
		}
	}
	return snap, nil
}

// Changed records a change an event stream saw.
func (l *Lister) Changed(c ingest.Change) {
	l.mu.Lock()
	l.changes = append(l.changes, c)
	l.mu.Unlock()
}

// Mirrors is every mirror at once, and the git source behind them: the
// workflows of every tree, a tiny model of commits for the lander
// (branch heads at the source, squashed stacks, conflicts by path, a
// push with a lease) and the faults set. Set its fields before use, or
// under Lock.
type Mirrors struct {
	mu        sync.Mutex
	Workflows []*workflow.Workflow
	Bad       []error
	FetchErr  error
	Conflict  bool
	opened    []string
	exported  []string

	// Heads are the source's branches (a branch not set is at
	// BaseCommit(branch)); Gone are the branches the source does not
	// have (mirror.ErrNoBranch).
	Heads map[string]string
	Gone  map[string]bool
	// Paths are the paths each pull head changes: two heads that change
	// a path in common conflict when squashed onto one another.
	Paths map[string][]string
	// Changed are the paths each commit changed (Repo.Changed), and
	// ChangedErr what Changed returns when set.
	Changed    map[string][]string
	ChangedErr error
	// BaseConflicts are the pull heads that do not merge onto the base.
	BaseConflicts map[string]bool
	// objects are the squashed commits in the mirror; parent and stack
	// say what each is: its parent, and the pull heads on it in order.
	objects map[string]bool
	parent  map[string]string
	stack   map[string][]string
	// MoveOnPush, when set, is where someone else moves the branch just
	// before the next push (the lease then refuses it).
	MoveOnPush string
	// PushGate, when set, holds every push (to PushGateSource alone, when
	// that is set) until it is closed: a slow source. Pushing, when set,
	// is closed as a push starts waiting.
	PushGate       <-chan struct{}
	PushGateSource string
	Pushing        chan struct{}
	pushes         []string
	refused        int
}

// Lock and Unlock guard the fields set while the rig runs.
func (f *Mirrors) Lock()   { f.mu.Lock() }
func (f *Mirrors) Unlock() { f.mu.Unlock() }

// BaseCommit is where a branch of the source starts.
func BaseCommit(branch string) string { return CommitID("base " + branch) }

// CommitID is a well-formed commit id made of s.
func CommitID(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

// SetWorkflows makes wfs the workflows of every tree.
func (f *Mirrors) SetWorkflows(wfs ...*workflow.Workflow) {
	f.mu.Lock()
	f.Workflows = wfs
	f.mu.Unlock()
}

// Head is where branch is at the source.
func (f *Mirrors) Head(branch string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.head(branch)
}

func (f *Mirrors) head(branch string) string {
	if c, ok := f.Heads[branch]; ok {
		return c
	}
	return BaseCommit(branch)
}

// MoveHead moves branch at the source (someone else pushed).
func (f *Mirrors) MoveHead(branch, commit string) {
	f.mu.Lock()
	if f.Heads == nil {
		f.Heads = map[string]string{}
	}
	f.Heads[branch] = commit
	f.mu.Unlock()
}

// Landed lists the pull heads on branch at the source, oldest first.
func (f *Mirrors) Landed(branch string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.stack[f.head(branch)])
}

// Parent is the parent of a squashed commit.
func (f *Mirrors) Parent(commit string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.parent[commit]
}

// Pushes are the pushes the source took ("branch old new"); Refused
// how many the lease refused.
func (f *Mirrors) Pushes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pushes)
}

// Refused is how many pushes the lease refused.
func (f *Mirrors) Refused() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

// Exported lists the trees exported for runs.
func (f *Mirrors) Exported() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.exported)
}

// Opened lists the mirror keys opened.
func (f *Mirrors) Opened() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.opened)
}

// SetPaths says which paths the pull head changes.
func (f *Mirrors) SetPaths(head string, paths ...string) {
	f.mu.Lock()
	if f.Paths == nil {
		f.Paths = map[string][]string{}
	}
	f.Paths[head] = paths
	f.mu.Unlock()
}

// Hold puts commits in the mirror, as a fetch of them would (Has).
func (f *Mirrors) Hold(commits ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objects == nil {
		f.objects, f.parent, f.stack = map[string]bool{}, map[string]string{}, map[string][]string{}
	}
	for _, c := range commits {
		f.objects[c] = true
	}
}

// Wipe forgets the squashed commits (a cache wiped), not the source.
func (f *Mirrors) Wipe() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.objects)
}

// Open opens the mirror of key.
func (f *Mirrors) Open(_ context.Context, key string) (job.Repo, error) {
	f.mu.Lock()
	f.opened = append(f.opened, key)
	f.mu.Unlock()
	return repo{f}, nil
}

type repo struct{ f *Mirrors }

func (r repo) Fetch(_ context.Context, _ job.Origin, _, _, _ string) error {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.FetchErr
}

func (r repo) Branch(_ context.Context, source, branch string) (string, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.f.Gone[branch] {
		return "", fmt.Errorf("%w %s at %s", mirror.ErrNoBranch, branch, source)
	}
	return r.f.head(branch), nil
}

func (r repo) Merge(_ context.Context, base, head string) (string, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.f.Conflict || r.f.BaseConflicts[head] {
		return "", &mirror.ConflictError{Base: base, Head: head, Detail: "CONFLICT (content): README"}
	}
	return "merge-" + head, nil
}

func (r repo) Workflows(context.Context, string) ([]*workflow.Workflow, []error, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return slices.Clone(r.f.Workflows), slices.Clone(r.f.Bad), nil
}

func (r repo) Export(_ context.Context, tree, dir string) error {
	r.f.mu.Lock()
	r.f.exported = append(r.f.exported, tree)
	r.f.mu.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "README"), []byte(tree), 0o600)
}

// Squash stacks the pulls onto base as mirror.Repo.Squash does: a pull
// that conflicts (with the base, or on a path an earlier pull of the
// stack changed) is left out; each other one gets a commit whose id
// depends only on its parent, head, message, identity and time, so
// squashing again gives the same commits.
func (r repo) Squash(_ context.Context, base string, pulls []job.SquashPull, who job.Identity, at time.Time) (string, []job.Squashed, error) {
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objects == nil {
		f.objects, f.parent, f.stack = map[string]bool{}, map[string]string{}, map[string][]string{}
	}
	tip := base
	changed := map[string]bool{}
	out := make([]job.Squashed, len(pulls))
	for i, p := range pulls {
		out[i].Head = p.Head
		if f.BaseConflicts[p.Head] {
			out[i].Conflicts, out[i].ConflictsWithBase = []string{"README"}, true
			continue
		}
		for _, path := range f.Paths[p.Head] {
			if changed[path] {
				out[i].Conflicts = append(out[i].Conflicts, path)
			}
		}
		if len(out[i].Conflicts) > 0 {
			continue
		}
		next := CommitID(fmt.Sprintf("%s\n%s\n%s\n%s <%s>\n%d", tip, p.Head, p.Message, who.Name, who.Email, at.Unix()))
		f.objects[next], f.parent[next] = true, tip
		f.stack[next] = append(slices.Clone(f.stack[tip]), p.Head)
		for _, path := range f.Paths[p.Head] {
			changed[path] = true
		}
		out[i].Commit, out[i].Changed, tip = next, slices.Clone(f.Paths[p.Head]), next
	}
	return tip, out, nil
}

// Push moves branch from old to new at the source, a fast-forward with
// a lease: when the branch is not at old it refuses with
// mirror.ErrBaseMoved. With PushGate set it first waits for it.
func (r repo) Push(ctx context.Context, source, branch, old, new string) error {
	f := r.f
	f.mu.Lock()
	gate, pushing := f.PushGate, f.Pushing
	if f.PushGateSource != "" && source != f.PushGateSource {
		gate, pushing = nil, nil
	}
	if pushing != nil {
		f.Pushing = nil
	}
	f.mu.Unlock()
	if gate != nil {
		if pushing != nil {
			close(pushing)
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.MoveOnPush != "" {
		if f.Heads == nil {
			f.Heads = map[string]string{}
		}
		f.Heads[branch], f.MoveOnPush = f.MoveOnPush, ""
	}
	if !f.objects[new] {
		return fmt.Errorf("rig mirror: push %s: not in the mirror", new)
	}
	ff := false
	for c := new; c != "" && !ff; c = f.parent[c] {
		ff = c == old
	}
	if !ff {
		return fmt.Errorf("rig mirror: push %s over %s: not a fast-forward", new, old)
	}
	if cur := f.head(branch); cur != old {
		f.refused++
		return fmt.Errorf("push %s: it is at %s, not %s: %w", branch, cur, old, mirror.ErrBaseMoved)
	}
	if f.Heads == nil {
		f.Heads = map[string]string{}
	}
	f.Heads[branch] = new
	f.pushes = append(f.pushes, branch+" "+old+" "+new)
	return nil
}

// Changed is what SetChanged set for to (nil: none), whatever from is.
func (r repo) Changed(_ context.Context, from, to string, mergeBase bool) ([]string, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.f.ChangedErr != nil {
		return nil, r.f.ChangedErr
	}
	return r.f.Changed[to], nil
}

func (r repo) Has(_ context.Context, commit string) bool {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.objects[commit]
}

// Blobs takes blobs and remembers their types.
type Blobs struct {
	mu    sync.Mutex
	types []string
	Err   error
}

// BlobCID is a well-formed blob CID (the rig does not hash).
const BlobCID = "bafkreibme22gw2h7y2h7tg2fhqotaqjucnbc24deqo72b6mkl2egezxhvy"

// UploadBlob takes a blob, or fails with Err.
func (f *Blobs) UploadBlob(_ context.Context, mimeType string, data []byte) (atdata.Blob, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Err != nil {
		return atdata.Blob{}, f.Err
	}
	f.types = append(f.types, mimeType)
	var ref atdata.CIDLink
	if err := ref.UnmarshalJSON([]byte(`{"$link":"` + BlobCID + `"}`)); err != nil {
		return atdata.Blob{}, err
	}
	return atdata.Blob{Ref: ref, MimeType: mimeType, Size: int64(len(data))}, nil
}

// Types lists the types of the blobs taken.
func (f *Blobs) Types() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.types)
}

// Sealed lists the sealed secrets set.
type Sealed struct {
	Recs []forge.Record[forge.Secret]
	Bad  []forge.Invalid
	Err  error
}

// Secrets lists the owner's sealed secrets.
func (f *Sealed) Secrets(context.Context, syntax.DID) ([]forge.Record[forge.Secret], []forge.Invalid, error) {
	return f.Recs, f.Bad, f.Err
}

// PDS takes check records (checks.Writer), or fails them as scripted.
type PDS struct {
	mu      sync.Mutex
	fail    []error
	written []string
	last    map[string]forge.Check
	hold    <-chan struct{}
}

// Hold makes every write wait until gate is closed (or its context
// ends): a slow PDS.
func (f *PDS) Hold(gate <-chan struct{}) {
	f.mu.Lock()
	f.hold = gate
	f.mu.Unlock()
}

// FailNext makes the next writes fail with errs, in order (a nil error:
// that write goes through).
func (f *PDS) FailNext(errs ...error) {
	f.mu.Lock()
	f.fail = append(f.fail, errs...)
	f.mu.Unlock()
}

// Put takes a check record.
func (f *PDS) Put(ctx context.Context, _, rkey string, v any) (syntax.ATURI, error) {
	f.mu.Lock()
	hold := f.hold
	f.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.fail) > 0 {
		err := f.fail[0]
		f.fail = f.fail[1:]
		if err != nil {
			return "", err
		}
	}
	c := v.(forge.Check)
	f.written = append(f.written, rkey+" "+c.Status)
	if f.last == nil {
		f.last = map[string]forge.Check{}
	}
	f.last[rkey] = c
	return "", nil
}

// Checks are the check records as last written, by key: what a new
// process lists at start.
func (f *PDS) Checks() map[string]forge.Check {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.last)
}

// Writes lists the checks written: "key status".
func (f *PDS) Writes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.written)
}

// Statuses lists the statuses written for the check of key.
func (f *PDS) Statuses(key string) []string {
	var out []string
	for _, w := range f.Writes() {
		if k, status, _ := strings.Cut(w, " "); k == key {
			out = append(out, status)
		}
	}
	return out
}

// Queue is the merge queue's records in memory: what the owner queued,
// the pulls, and what the lander wrote (validated against the
// lexicons, as pdsclient.Account.Put does).
type Queue struct {
	mu        sync.Mutex
	cat       *pdsclient.Catalog
	entries   []forge.Record[forge.QueueEntry]
	pulls     map[syntax.ATURI]forge.Pull
	batches   map[string]forge.Batch
	ejections map[string]forge.Ejection
	landings  map[string]forge.Landing
	puts      []string
	born      map[string]int
	failPut   map[string]error
}

// NewQueue returns an empty queue.
func NewQueue() *Queue {
	return &Queue{pulls: map[syntax.ATURI]forge.Pull{}, batches: map[string]forge.Batch{}, ejections: map[string]forge.Ejection{},
		landings: map[string]forge.Landing{}, failPut: map[string]error{}, born: map[string]int{}}
}

// Entries lists the owner's queue entries.
func (f *Queue) Entries(_ context.Context, owner syntax.DID) ([]forge.Record[forge.QueueEntry], []forge.Invalid, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []forge.Record[forge.QueueEntry]
	for _, e := range f.entries {
		if e.URI.Authority().String() == owner.String() {
			out = append(out, e)
		}
	}
	return out, nil, nil
}

// Pull reads a pull; pdsclient.ErrNotFound when it is gone.
func (f *Queue) Pull(_ context.Context, uri syntax.ATURI) (forge.Pull, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pulls[uri]
	if !ok {
		return forge.Pull{}, fmt.Errorf("get %s: %w", uri, pdsclient.ErrNotFound)
	}
	return p, nil
}

func own[T any](collection string, m map[string]T) []forge.Record[T] {
	var out []forge.Record[T]
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, forge.Record[T]{URI: OwnURI(collection, k), Value: m[k]})
	}
	return out
}

// OwnURI is the AT-URI of one of the runner's own records.
func OwnURI(collection, rkey string) syntax.ATURI {
	return syntax.ATURI("at://" + Runner + "/" + collection + "/" + rkey)
}

// Batches lists the lander's batches.
func (f *Queue) Batches(context.Context) ([]forge.Record[forge.Batch], []forge.Invalid, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return own(forge.CollectionBatch, f.batches), nil, nil
}

// Ejections lists the lander's ejections.
func (f *Queue) Ejections(context.Context) ([]forge.Record[forge.Ejection], []forge.Invalid, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return own(forge.CollectionEjection, f.ejections), nil, nil
}

// Put writes one of the lander's records, validated as the PDS would.
func (f *Queue) Put(_ context.Context, collection, rkey string, v any) (syntax.ATURI, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failPut[collection]; err != nil {
		return "", err
	}
	if f.cat == nil {
		cat, err := pdsclient.NewCatalog()
		if err != nil {
			return "", err
		}
		f.cat = cat
	}
	if _, err := f.cat.Encode(collection, v); err != nil {
		return "", err
	}
	switch rec := v.(type) {
	case forge.Batch:
		rec.Pulls = slices.Clone(rec.Pulls)
		if _, ok := f.batches[rkey]; !ok {
			f.born[rkey] = len(f.born)
		}
		f.batches[rkey] = rec
	case forge.Ejection:
		f.ejections[rkey] = rec
	case forge.Landing:
		f.landings[rkey] = rec
	default:
		return "", fmt.Errorf("rig queue: %T is no record of the lander", v)
	}
	f.puts = append(f.puts, collection+" "+rkey)
	return OwnURI(collection, rkey), nil
}

// FailPut makes the writes of a collection fail with err (nil: take
// them again).
func (f *Queue) FailPut(collection string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.failPut, collection)
		return
	}
	f.failPut[collection] = err
}

// Puts are the lander's writes in order: "collection rkey".
func (f *Queue) Puts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.puts)
}

// Batch is the batch of rkey.
func (f *Queue) Batch(rkey string) forge.Batch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.batches[rkey]
}

// SetBatch writes a batch as an earlier lander left it.
func (f *Queue) SetBatch(rkey string, b forge.Batch) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.batches[rkey]; !ok {
		f.born[rkey] = len(f.born)
	}
	f.batches[rkey] = b
}

// BatchList is the batches written, in the order they were built.
func (f *Queue) BatchList() []forge.Batch {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(f.batches), func(a, b string) int { return f.born[a] - f.born[b] })
	bs := make([]forge.Batch, len(keys))
	for i, k := range keys {
		bs[i] = f.batches[k]
	}
	return bs
}

// Reasons are the ejections' reasons by pull.
func (f *Queue) Reasons() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for _, e := range f.ejections {
		out[e.Pull] = e.Reason
	}
	return out
}

// Ejection is the ejection of pull.
func (f *Queue) Ejection(pull string) forge.Ejection {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.ejections {
		if e.Pull == pull {
			return e
		}
	}
	return forge.Ejection{}
}

// Landings lists the landings written.
func (f *Queue) Landings() []forge.Landing {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Values(f.landings))
}

// GetPull is the pull of uri as set.
func (f *Queue) GetPull(uri string) forge.Pull {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pulls[syntax.ATURI(uri)]
}

// SetPull writes a pull record.
func (f *Queue) SetPull(uri string, p forge.Pull) {
	f.mu.Lock()
	f.pulls[syntax.ATURI(uri)] = p
	f.mu.Unlock()
}

// DeletePull deletes a pull record.
func (f *Queue) DeletePull(uri string) {
	f.mu.Lock()
	delete(f.pulls, syntax.ATURI(uri))
	f.mu.Unlock()
}

// EditEntry changes the owner's i-th queue entry.
func (f *Queue) EditEntry(i int, edit func(*forge.QueueEntry)) {
	f.mu.Lock()
	edit(&f.entries[i].Value)
	f.mu.Unlock()
}

// QueuePull opens pull n of author did:plc:author on the rig's
// repository (its head changing paths, in m) and has the owner queue
// it; n orders the queue.
func (f *Queue) QueuePull(m *Mirrors, n int, paths ...string) (uri, head string) {
	return f.QueuePullTo(m, RepoRecord(), "main", n, paths...)
}

// QueuePullTo is QueuePull onto base of repo, a repository of the
// owner.
func (f *Queue) QueuePullTo(m *Mirrors, repo forge.Record[forge.Repo], base string, n int, paths ...string) (uri, head string) {
	uri = fmt.Sprintf("at://did:plc:author/%s/3p%d", forge.CollectionPull, n)
	head = CommitID(fmt.Sprintf("head %d", n))
	f.SetPull(uri, forge.Pull{Type: forge.CollectionPull, Repo: repo.URI.String(), Base: base,
		Head:  forge.PullHead{Source: "https://git.test/author/fork", Ref: fmt.Sprintf("topic%d", n), Commit: head},
		Title: fmt.Sprintf("pull %d", n), State: forge.PullOpen, CreatedAt: "2026-01-01T00:00:00.000Z"})
	f.mu.Lock()
	f.entries = append(f.entries, forge.Record[forge.QueueEntry]{
		URI: syntax.ATURI(fmt.Sprintf("at://%s/%s/3q%d", Owner, forge.CollectionQueueEntry, n)),
		Value: forge.QueueEntry{Type: forge.CollectionQueueEntry, Repo: repo.URI.String(), Pull: uri, Commit: head, Base: base,
			CreatedAt: fmt.Sprintf("2026-01-01T00:00:%02d.000Z", n)}})
	f.mu.Unlock()
	m.SetPaths(head, paths...)
	return uri, head
}

// CancelOf is actor's cancel record of the check of key (rkey its
// record key).
func CancelOf(actor, rkey, key string) forge.Record[forge.Cancel] {
	return forge.Record[forge.Cancel]{URI: syntax.ATURI("at://" + actor + "/" + forge.CollectionCancel + "/" + rkey),
		Value: forge.Cancel{Type: forge.CollectionCancel, Check: key, CreatedAt: forge.Now()}}
}

// RerunOf is actor's rerun record rec (rkey a TID), its check key set.
func RerunOf(actor, rkey, key string, rec forge.Rerun) forge.Record[forge.Rerun] {
	rec.Type, rec.Check, rec.CreatedAt = forge.CollectionRerun, key, forge.Now()
	return forge.Record[forge.Rerun]{URI: syntax.ATURI("at://" + actor + "/" + forge.CollectionRerun + "/" + rkey), Value: rec}
}

// DispatchOf is the owner's dispatch record of workflow wf on ref (rkey
// a TID) of the rig's repository, with inputs.
func DispatchOf(rkey, ref, wf string, inputs ...forge.Variable) forge.Record[forge.Dispatch] {
	return forge.Record[forge.Dispatch]{URI: syntax.ATURI("at://" + Owner + "/" + forge.CollectionDispatch + "/" + rkey),
		Value: forge.Dispatch{Type: forge.CollectionDispatch, Repo: Repo, Ref: ref, Workflow: wf, Inputs: inputs, CreatedAt: forge.Now()}}
}
