package daemon

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/run"
	"knotless.dev/run/internal/state"
	"knotless.dev/run/internal/workflow"
)

// A rig is a Daemon whose outside is in memory: the intake, the
// mirrors (and the git source behind them), the blob store, the sealed
// secrets, the merge queue's records (fakeQueue), the check writer
// (fakePDS) and the executor (fakeexec). It drives the daemon's own
// code, serve and its workers included, with no server, git or process.
// The real-PDS tests (world_test.go) cover the same ground end to end.
type rig struct {
	d     *Daemon
	pds   *fakePDS
	in    *fakeIntake
	git   *fakeMirrors
	blobs *fakeBlobs
	exec  *fakeexec.Executor
	notes *notes
	queue *fakeQueue
}

const (
	rigRunner = "did:plc:runner"
	rigOwner  = "did:plc:owner"
	rigSource = "https://git.test/owner/r"
)

func newRig(t *testing.T) *rig {
	t.Helper()
	d, pds := testDaemon(t)
	r := &rig{d: d, pds: pds, in: &fakeIntake{}, git: &fakeMirrors{}, blobs: &fakeBlobs{}, exec: &fakeexec.Executor{}, notes: &notes{},
		queue: newFakeQueue()}
	r.use(d)
	return r
}

// use makes d run on the rig's fakes.
func (r *rig) use(d *Daemon) {
	d.cfg.Runner = rigRunner
	d.cfg.Executor = r.exec
	d.cfg.Notify = r.notes.add
	d.cfg.StopWait = time.Minute
	d.lister, d.mirrors, d.blobs, d.sealed, d.queue = r.in, r.git, r.blobs, &fakeSealed{}, r.queue
	d.engine = run.New(run.Config{Executor: r.exec, Runner: rigRunner})
	d.detach = make(chan struct{})
	d.faults.swept = true
}

// successor is the daemon a restarted process would be: the same state
// and cache directories, loaded from disk, on the same fakes.
func (r *rig) successor(t *testing.T) *Daemon {
	t.Helper()
	st, err := state.Load(r.d.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.d.cfg
	d := &Daemon{cfg: cfg, log: r.d.log, wake: make(chan struct{}, 1), q: newQueue(), st: st, rec: r.d.rec}
	d.cfg.HTTP = d.faults.init(d.cfg.HTTP)
	d.sf.dir = cfg.StateDir
	r.use(d)
	return d
}

// serveRig runs d.serve until the returned stop is called (a SIGTERM),
// or the test ends; stop waits for the handover.
func serveRig(t *testing.T, d *Daemon) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = d.serve(ctx)
		close(done)
	}()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

func repoRecord() forge.Record[forge.Repo] {
	return forge.Record[forge.Repo]{URI: syntax.ATURI(testRepo), Value: forge.Repo{Name: "r", Source: rigSource}}
}

// push is a push by the owner to main.
func push(rkey, commit string) ingest.Event {
	return ingest.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://" + rigOwner + "/" + forge.CollectionRefUpdate + "/" + rkey),
		Repo: repoRecord(), Ref: "refs/heads/main", Commit: commit, Trusted: true}
}

// pull is a pull by author onto main.
func pull(author, rkey, commit string) ingest.Event {
	return ingest.Event{Kind: forge.KindPull, URI: syntax.ATURI("at://" + author + "/" + forge.CollectionPull + "/" + rkey),
		Repo: repoRecord(), Ref: "refs/heads/main", Commit: commit,
		Pull: &forge.Pull{Base: "main", Head: forge.PullHead{Source: "https://git.test/" + author + "/fork", Ref: "topic"}}}
}

// ciWorkflow runs on pushes and pulls: one step per script.
func ciWorkflow(name string, scripts ...string) *workflow.Workflow {
	wf := &workflow.Workflow{Name: name, File: ".knotless/workflows/" + name + ".yaml", On: []workflow.Trigger{workflow.Push, workflow.Pull}}
	for i, s := range scripts {
		wf.Steps = append(wf.Steps, workflow.Step{Name: name + "-" + string(rune('a'+i)), Run: s})
	}
	return wf
}

// fakeIntake answers Reconcile with the events set, and lists their
// repositories and the repositories set.
type fakeIntake struct {
	mu      sync.Mutex
	events  []ingest.Event
	repos   []forge.Record[forge.Repo]
	err     error
	changes []ingest.Change
}

func (f *fakeIntake) set(evs ...ingest.Event) {
	f.mu.Lock()
	f.events = evs
	f.mu.Unlock()
}

func (f *fakeIntake) Reconcile(context.Context) (*ingest.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	snap := &ingest.Snapshot{Events: slices.Clone(f.events), Hosts: []string{"http://127.0.0.1:1"}}
	seen := map[syntax.ATURI]bool{}
	for _, ev := range f.events {
		if !seen[ev.Repo.URI] {
			seen[ev.Repo.URI] = true
			snap.Repos = append(snap.Repos, ev.Repo)
		}
	}
	for _, repo := range f.repos {
		if !seen[repo.URI] {
			seen[repo.URI] = true
			snap.Repos = append(snap.Repos, repo)
		}
	}
	return snap, nil
}

func (f *fakeIntake) Changed(c ingest.Change) {
	f.mu.Lock()
	f.changes = append(f.changes, c)
	f.mu.Unlock()
}

// fakeMirrors is every mirror at once, and the git source behind them:
// the workflows of every tree, a tiny model of commits for the lander
// (branch heads at the source, squashed stacks, conflicts by path, a
// push with a lease) and the faults set.
type fakeMirrors struct {
	mu        sync.Mutex
	workflows []*workflow.Workflow
	bad       []error
	fetchErr  error
	conflict  bool
	opened    []string
	exported  []string

	// heads are the source's branches (a branch not set is at
	// baseCommit(branch)).
	heads map[string]string
	// paths are the paths each pull head changes: two heads that change
	// a path in common conflict when squashed onto one another.
	paths map[string][]string
	// baseConflicts are the pull heads that do not merge onto the base.
	baseConflicts map[string]bool
	// objects are the squashed commits in the mirror; parent and stack
	// say what each is: its parent, and the pull heads on it in order.
	objects map[string]bool
	parent  map[string]string
	stack   map[string][]string
	// moveOnPush, when set, is where someone else moves the branch just
	// before the next push (the lease then refuses it).
	moveOnPush string
	// pushes are the pushes the source took ("branch old new"), refused
	// those the lease refused.
	pushes  []string
	refused int
}

// baseCommit is where a branch of the source starts.
func baseCommit(branch string) string { return commitID("base " + branch) }

// commitID is a well-formed commit id made of s.
func commitID(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

func (f *fakeMirrors) setWorkflows(wfs ...*workflow.Workflow) {
	f.mu.Lock()
	f.workflows = wfs
	f.mu.Unlock()
}

func (f *fakeMirrors) head(branch string) string {
	if c, ok := f.heads[branch]; ok {
		return c
	}
	return baseCommit(branch)
}

// landed lists the pull heads on branch at the source, oldest first.
func (f *fakeMirrors) landed(branch string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.stack[f.head(branch)])
}

func (f *fakeMirrors) Open(_ context.Context, key string) (gitRepo, error) {
	f.mu.Lock()
	f.opened = append(f.opened, key)
	f.mu.Unlock()
	return fakeRepo{f}, nil
}

type fakeRepo struct{ f *fakeMirrors }

func (r fakeRepo) Fetch(_ context.Context, _ mirror.Origin, _, _, _ string) error {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.fetchErr
}

func (r fakeRepo) Branch(_ context.Context, _, branch string) (string, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.head(branch), nil
}

func (r fakeRepo) Merge(_ context.Context, base, head string) (string, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.f.conflict || r.f.baseConflicts[head] {
		return "", &mirror.ConflictError{Base: base, Head: head, Detail: "CONFLICT (content): README"}
	}
	return "merge-" + head, nil
}

func (r fakeRepo) Workflows(context.Context, string) ([]*workflow.Workflow, []error, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return slices.Clone(r.f.workflows), slices.Clone(r.f.bad), nil
}

func (r fakeRepo) Export(_ context.Context, tree, dir string) error {
	r.f.mu.Lock()
	r.f.exported = append(r.f.exported, tree)
	r.f.mu.Unlock()
	return writePrivate(dir+"/README", []byte(tree))
}

// Squash stacks the pulls onto base as mirror.Repo.Squash does: a pull
// that conflicts (with the base, or on a path an earlier pull of the
// stack changed) is left out; each other one gets a commit whose id
// depends only on its parent, head, message, identity and time, so
// squashing again gives the same commits.
func (r fakeRepo) Squash(_ context.Context, base string, pulls []mirror.SquashPull, who mirror.Identity, at time.Time) (string, []mirror.Squashed, error) {
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.objects == nil {
		f.objects, f.parent, f.stack = map[string]bool{}, map[string]string{}, map[string][]string{}
	}
	tip := base
	changed := map[string]bool{}
	out := make([]mirror.Squashed, len(pulls))
	for i, p := range pulls {
		out[i].Head = p.Head
		if f.baseConflicts[p.Head] {
			out[i].Conflicts, out[i].ConflictsWithBase = []string{"README"}, true
			continue
		}
		for _, path := range f.paths[p.Head] {
			if changed[path] {
				out[i].Conflicts = append(out[i].Conflicts, path)
			}
		}
		if len(out[i].Conflicts) > 0 {
			continue
		}
		next := commitID(fmt.Sprintf("%s\n%s\n%s\n%s <%s>\n%d", tip, p.Head, p.Message, who.Name, who.Email, at.Unix()))
		f.objects[next], f.parent[next] = true, tip
		f.stack[next] = append(slices.Clone(f.stack[tip]), p.Head)
		for _, path := range f.paths[p.Head] {
			changed[path] = true
		}
		out[i].Commit, out[i].Changed, tip = next, slices.Clone(f.paths[p.Head]), next
	}
	return tip, out, nil
}

// Push moves branch from old to new at the source, a fast-forward with
// a lease: when the branch is not at old it refuses with
// mirror.ErrBaseMoved.
func (r fakeRepo) Push(_ context.Context, _, branch, old, new string, _ mirror.PushCredentials) error {
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.moveOnPush != "" {
		if f.heads == nil {
			f.heads = map[string]string{}
		}
		f.heads[branch], f.moveOnPush = f.moveOnPush, ""
	}
	if !f.objects[new] {
		return fmt.Errorf("fake mirror: push %s: not in the mirror", new)
	}
	ff := false
	for c := new; c != "" && !ff; c = f.parent[c] {
		ff = c == old
	}
	if !ff {
		return fmt.Errorf("fake mirror: push %s over %s: not a fast-forward", new, old)
	}
	if cur := f.head(branch); cur != old {
		f.refused++
		return fmt.Errorf("push %s: it is at %s, not %s: %w", branch, cur, old, mirror.ErrBaseMoved)
	}
	if f.heads == nil {
		f.heads = map[string]string{}
	}
	f.heads[branch] = new
	f.pushes = append(f.pushes, branch+" "+old+" "+new)
	return nil
}

func (r fakeRepo) Has(_ context.Context, commit string) bool {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return r.f.objects[commit]
}

// wipe forgets the squashed commits (a cache wiped), not the source.
func (f *fakeMirrors) wipe() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.objects)
}

// fakeBlobs takes blobs and remembers their types.
type fakeBlobs struct {
	mu    sync.Mutex
	types []string
	err   error
}

func (f *fakeBlobs) UploadBlob(_ context.Context, mimeType string, data []byte) (atdata.Blob, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return atdata.Blob{}, f.err
	}
	f.types = append(f.types, mimeType)
	var ref atdata.CIDLink
	if err := ref.UnmarshalJSON([]byte(`{"$link":"` + blobCID + `"}`)); err != nil {
		return atdata.Blob{}, err
	}
	return atdata.Blob{Ref: ref, MimeType: mimeType, Size: int64(len(data))}, nil
}

// blobCID is a well-formed blob CID (the fake does not hash).
const blobCID = "bafkreibme22gw2h7y2h7tg2fhqotaqjucnbc24deqo72b6mkl2egezxhvy"

// fakeSealed lists the sealed secrets set.
type fakeSealed struct {
	recs []forge.Record[forge.Secret]
	bad  []forge.Invalid
	err  error
}

func (f *fakeSealed) Secrets(context.Context, syntax.DID) ([]forge.Record[forge.Secret], []forge.Invalid, error) {
	return f.recs, f.bad, f.err
}

// final returns the last status written for the check of workflow on
// ev, and the check as known.
func (r *rig) final(ev ingest.Event, workflow string) forge.Check {
	c, _ := r.d.rec.Get(forge.CheckKey(ev.Subject(), workflow))
	return c
}

// statuses lists the statuses written for the check of workflow on ev.
func (r *rig) statuses(ev ingest.Event, workflow string) []string {
	key := forge.CheckKey(ev.Subject(), workflow)
	var out []string
	for _, w := range r.pds.writes() {
		if k, status, _ := strings.Cut(w, " "); k == key {
			out = append(out, status)
		}
	}
	return out
}
