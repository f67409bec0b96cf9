package daemon

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/workflow"
)

// The merge queue's lander on the rig: the owner's queue entries, the
// pulls and the lander's own records in a fakeQueue, the source and its
// squashes in the fakeMirrors model, the pre-flights and batches run by
// fakeexec, all in a synctest bubble. The real-PDS tests
// (mergequeue_test.go, lander_kill_test.go) cover the same ground with
// real git and a real PDS.

// fakeQueue is the merge queue's records in memory: what the owner
// queued, the pulls, and what the lander wrote (validated against the
// lexicons, as forge.Account.Put does).
type fakeQueue struct {
	mu        sync.Mutex
	cat       *forge.Catalog
	entries   []forge.Record[forge.QueueEntry]
	pulls     map[syntax.ATURI]forge.Pull
	batches   map[string]forge.Batch
	ejections map[string]forge.Ejection
	landings  map[string]forge.Landing
	// puts are the lander's writes in order: "collection rkey".
	puts []string
	// born orders the batches by their first write.
	born map[string]int
	// failPut fails the writes of a collection.
	failPut map[string]error
}

func newFakeQueue() *fakeQueue {
	return &fakeQueue{pulls: map[syntax.ATURI]forge.Pull{}, batches: map[string]forge.Batch{}, ejections: map[string]forge.Ejection{},
		landings: map[string]forge.Landing{}, failPut: map[string]error{}, born: map[string]int{}}
}

func (f *fakeQueue) Entries(_ context.Context, owner syntax.DID) ([]forge.Record[forge.QueueEntry], []forge.Invalid, error) {
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

func (f *fakeQueue) Pull(_ context.Context, uri syntax.ATURI) (forge.Pull, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pulls[uri]
	if !ok {
		return forge.Pull{}, fmt.Errorf("get %s: %w", uri, forge.ErrNotFound)
	}
	return p, nil
}

func own[T any](collection string, m map[string]T) []forge.Record[T] {
	var out []forge.Record[T]
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, forge.Record[T]{URI: ownURI(collection, k), Value: m[k]})
	}
	return out
}

func ownURI(collection, rkey string) syntax.ATURI {
	return syntax.ATURI("at://" + rigRunner + "/" + collection + "/" + rkey)
}

func (f *fakeQueue) Batches(context.Context) ([]forge.Record[forge.Batch], []forge.Invalid, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return own(forge.CollectionBatch, f.batches), nil, nil
}

func (f *fakeQueue) Ejections(context.Context) ([]forge.Record[forge.Ejection], []forge.Invalid, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return own(forge.CollectionEjection, f.ejections), nil, nil
}

func (f *fakeQueue) Put(_ context.Context, collection, rkey string, v any) (syntax.ATURI, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failPut[collection]; err != nil {
		return "", err
	}
	if f.cat == nil {
		cat, err := forge.NewCatalog()
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
		return "", fmt.Errorf("fake queue: %T is no record of the lander", v)
	}
	f.puts = append(f.puts, collection+" "+rkey)
	return ownURI(collection, rkey), nil
}

func (f *fakeQueue) batch(rkey string) forge.Batch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.batches[rkey]
}

// batchList is the batches written, in the order they were built.
func (f *fakeQueue) batchList() []forge.Batch {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(f.batches), func(a, b string) int { return f.born[a] - f.born[b] })
	bs := make([]forge.Batch, len(keys))
	for i, k := range keys {
		bs[i] = f.batches[k]
	}
	return bs
}

// reasons are the ejections' reasons by pull.
func (f *fakeQueue) reasons() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for _, e := range f.ejections {
		out[e.Pull] = e.Reason
	}
	return out
}

func (f *fakeQueue) ejection(pull string) forge.Ejection {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.ejections {
		if e.Pull == pull {
			return e
		}
	}
	return forge.Ejection{}
}

func (f *fakeQueue) landingList() []forge.Landing {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Values(f.landings))
}

func (f *fakeQueue) setPull(uri string, p forge.Pull) {
	f.mu.Lock()
	f.pulls[syntax.ATURI(uri)] = p
	f.mu.Unlock()
}

// queueRepo is testRepo naming runners, of which landers may push.
func queueRepo(runners, landers []string) forge.Record[forge.Repo] {
	return forge.Record[forge.Repo]{URI: syntax.ATURI(testRepo),
		Value: forge.Repo{Name: "r", Source: rigSource, Runners: runners, Landers: landers}}
}

// queueScript is what the rig's runs do: the pre-flight of a pull in
// failPre fails, and so does a batch holding the head culprit.
type queueScript struct {
	r       *rig
	failPre map[string]bool
	culprit string
}

func (s *queueScript) step(runID, _ string) fakeexec.Step {
	ev := s.r.exec.Session(runID).Spec().Annotations["knotless.dev/event"]
	if s.failPre[ev] {
		return fakeexec.Step{Output: "pre-flight says no\n", Code: 1}
	}
	if uri := syntax.ATURI(ev); s.culprit != "" && uri.Collection().String() == forge.CollectionBatch {
		for _, p := range s.r.queue.batch(uri.RecordKey().String()).Pulls {
			if p.Commit == s.culprit {
				return fakeexec.Step{Output: "fails together\n", Code: 1}
			}
		}
	}
	return fakeexec.Step{}
}

// newLanderRig is a rig whose runner lands testRepo's queue (--queue):
// pre is its pre-flight (queue: first), batch its on: batch workflow.
func newLanderRig(t *testing.T) (*rig, *queueScript) {
	t.Helper()
	r := newRig(t)
	r.d.cfg.Queue = true
	r.in.repos = []forge.Record[forge.Repo]{queueRepo([]string{rigRunner}, []string{rigRunner})}
	r.git.setWorkflows(
		&workflow.Workflow{Name: "pre", File: ".knotless/workflows/pre.yaml", On: []workflow.Trigger{workflow.Pull}, Queue: "first",
			Steps: []workflow.Step{{Name: "check", Run: "make check"}}},
		&workflow.Workflow{Name: "batch", File: ".knotless/workflows/batch.yaml", On: []workflow.Trigger{workflow.Batch},
			Steps: []workflow.Step{{Name: "test", Run: "make test"}}},
	)
	s := &queueScript{r: r, failPre: map[string]bool{}}
	r.exec.Script = s.step
	return r, s
}

// queuePull opens pull n (its head changing paths) and has the owner
// queue it; n orders the queue.
func (r *rig) queuePull(n int, paths ...string) (uri, head string) {
	uri = fmt.Sprintf("at://did:plc:author/%s/3p%d", forge.CollectionPull, n)
	head = commitID(fmt.Sprintf("head %d", n))
	r.queue.setPull(uri, forge.Pull{Type: forge.CollectionPull, Repo: testRepo, Base: "main",
		Head:  forge.PullHead{Source: "https://git.test/author/fork", Ref: fmt.Sprintf("topic%d", n), Commit: head},
		Title: fmt.Sprintf("pull %d", n), State: forge.PullOpen, CreatedAt: "2026-01-01T00:00:00.000Z"})
	r.queue.mu.Lock()
	r.queue.entries = append(r.queue.entries, forge.Record[forge.QueueEntry]{
		URI: syntax.ATURI(fmt.Sprintf("at://%s/%s/3q%d", rigOwner, forge.CollectionQueueEntry, n)),
		Value: forge.QueueEntry{Type: forge.CollectionQueueEntry, Repo: testRepo, Pull: uri, Commit: head, Base: "main",
			CreatedAt: fmt.Sprintf("2026-01-01T00:00:%02d.000Z", n)}})
	r.queue.mu.Unlock()
	r.git.mu.Lock()
	if r.git.paths == nil {
		r.git.paths = map[string][]string{}
	}
	r.git.paths[head] = paths
	r.git.mu.Unlock()
	return uri, head
}

// serveUntilIdle serves d until nothing is left to do (every run ended
// and the queue settled), then stops it.
func serveUntilIdle(t *testing.T, d *Daemon) {
	stop := serveRig(t, d)
	synctest.Wait()
	stop()
}

// pulls is a batch's pulls as pull URIs.
func batchPulls(b forge.Batch) []string {
	var out []string
	for _, p := range b.Pulls {
		out = append(out, p.Pull)
	}
	return out
}

// A two-pull batch: both pre-flights pass, the pulls are squashed onto
// main in queue order, the batch's checks pass, main is pushed once and
// one landing records it.
func TestLanderLandsTwoPullsInOrder(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, _ := newLanderRig(t)
		p2, h2 := r.queuePull(2, "b.txt")
		p1, h1 := r.queuePull(1, "a.txt")
		serveUntilIdle(t, r.d)

		if diff := cmp.Diff([]string{h1, h2}, r.git.landed("main")); diff != "" {
			t.Errorf("pulls on main (-want +got):\n%s", diff)
		}
		if len(r.git.pushes) != 1 {
			t.Errorf("pushes %q, want one", r.git.pushes)
		}
		bs := r.queue.batchList()
		if len(bs) != 1 || bs[0].Status != forge.BatchLanded || !slices.Equal(batchPulls(bs[0]), []string{p1, p2}) {
			t.Fatalf("batches %+v, want one landed batch of pull 1 then 2", bs)
		}
		ls := r.queue.landingList()
		want := []forge.Landing{{Type: forge.CollectionLanding, Repo: testRepo, Ref: "refs/heads/main", Old: baseCommit("main"),
			New: r.git.head("main"), Batch: string(ownURI(forge.CollectionBatch, forge.BatchKey(testRepo, bs[0].Base, bs[0].Pulls)))}}
		for i := range ls {
			ls[i].CreatedAt = ""
		}
		if diff := cmp.Diff(want, ls); diff != "" {
			t.Errorf("landings (-want +got):\n%s", diff)
		}
		if len(r.queue.reasons()) != 0 {
			t.Errorf("ejections %v, want none", r.queue.reasons())
		}
		for _, p := range []string{p1, p2} {
			ev := preflightEvent(repoRecord(), p, forge.Pull{Base: "main", Head: forge.PullHead{Commit: r.queue.pulls[syntax.ATURI(p)].Head.Commit}})
			if got := r.statuses(ev, "pre"); !slices.Equal(got, []string{"queued", "running", "success"}) {
				t.Errorf("pre-flight of %s: %q", p, got)
			}
		}
		if saved(t, r.d).Lander[testRepo] == nil {
			t.Error("state.json keeps no lander memory for the repository")
		}
	})
}

// Each way a pull leaves the queue is recorded with its reason, and the
// other pulls land.
func TestLanderEjects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// setup queues pulls 1 (x.txt), 2 (y.txt) and 3 (z.txt) and
		// breaks one of them: the culprit.
		setup  func(r *rig, s *queueScript, heads []string, uris []string)
		reason string
		detail string
	}{
		{"conflict with the base", func(r *rig, _ *queueScript, heads, _ []string) {
			r.git.baseConflicts = map[string]bool{heads[1]: true}
		}, forge.EjectConflictBase, "conflicts with the base branch"},
		{"conflict with an earlier pull", func(r *rig, _ *queueScript, heads, _ []string) {
			r.git.paths[heads[1]] = []string{"y.txt", "x.txt"}
		}, forge.EjectConflictPull, "conflicts with the earlier pull at://did:plc:author/dev.knotless.pull/3p1 of the batch: x.txt"},
		{"failing pre-flight", func(_ *rig, s *queueScript, _, uris []string) {
			s.failPre[uris[1]] = true
		}, forge.EjectPreflight, "pre-flight workflow pre: failure in step check"},
		{"fails only in a batch", func(_ *rig, s *queueScript, heads, _ []string) {
			s.culprit = heads[1]
		}, forge.EjectBatch, "fails in a batch on the base branch: workflow batch: failure"},
		{"head moved", func(r *rig, _ *queueScript, _, uris []string) {
			p := r.queue.pulls[syntax.ATURI(uris[1])]
			p.Head.Commit = commitID("pushed again")
			r.queue.pulls[syntax.ATURI(uris[1])] = p
		}, forge.EjectHeadMoved, "the head moved from the approved"},
		{"closed", func(r *rig, _ *queueScript, _, uris []string) {
			p := r.queue.pulls[syntax.ATURI(uris[1])]
			p.State = "closed"
			r.queue.pulls[syntax.ATURI(uris[1])] = p
		}, forge.EjectClosed, "no longer open"},
		{"pull record gone", func(r *rig, _ *queueScript, _, uris []string) {
			delete(r.queue.pulls, syntax.ATURI(uris[1]))
		}, forge.EjectClosed, "the pull record is gone"},
		{"base changed after queueing", func(r *rig, _ *queueScript, _, uris []string) {
			p := r.queue.pulls[syntax.ATURI(uris[1])]
			p.Base = "release"
			r.queue.pulls[syntax.ATURI(uris[1])] = p
		}, forge.EjectBaseChanged, `base changed after queueing: the entry approved "main", the pull now targets "release"`},
		{"entry naming no base", func(r *rig, _ *queueScript, _, _ []string) {
			r.queue.entries[1].Value.Base = ""
		}, forge.EjectNoBase, "the queue entry names no base branch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				r, s := newLanderRig(t)
				var uris, heads []string
				for i, path := range []string{"x.txt", "y.txt", "z.txt"} {
					u, h := r.queuePull(i+1, path)
					uris, heads = append(uris, u), append(heads, h)
				}
				tc.setup(r, s, heads, uris)
				serveUntilIdle(t, r.d)

				if diff := cmp.Diff(map[string]string{uris[1]: tc.reason}, r.queue.reasons()); diff != "" {
					t.Errorf("ejections (-want +got):\n%s", diff)
				}
				if ej := r.queue.ejection(uris[1]); !strings.Contains(ej.Detail, tc.detail) || ej.Commit != heads[1] {
					t.Errorf("ejection %+v, want detail with %q at the approved commit", ej, tc.detail)
				}
				if diff := cmp.Diff([]string{heads[0], heads[2]}, r.git.landed("main")); diff != "" {
					t.Errorf("pulls on main (-want +got):\n%s", diff)
				}
				if left := r.exec.Running(); len(left) != 0 {
					t.Errorf("sessions left: %v", left)
				}
			})
		})
	}
}

// A batch that fails only when squashed is bisected: the culprit is
// ejected with the batch's failure, the rest land, no pull twice.
func TestLanderBisects(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, s := newLanderRig(t)
		var uris, heads []string
		for i := range 4 {
			u, h := r.queuePull(i+1, fmt.Sprintf("f%d.txt", i))
			uris, heads = append(uris, u), append(heads, h)
		}
		s.culprit = heads[2]
		serveUntilIdle(t, r.d)

		if diff := cmp.Diff([]string{heads[0], heads[1], heads[3]}, r.git.landed("main")); diff != "" {
			t.Errorf("pulls on main (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]string{uris[2]: forge.EjectBatch}, r.queue.reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
		if ej := r.queue.ejection(uris[2]); ej.Batch == "" {
			t.Error("the ejection names no batch")
		}
		var statuses []string
		for _, b := range r.queue.batchList() {
			statuses = append(statuses, fmt.Sprintf("%s %d", b.Status, len(b.Pulls)))
		}
		// 4 fail; its first half (2) lands; the other half fails, is
		// split, the culprit fails alone and the last lands.
		want := []string{"failed 4", "landed 2", "failed 2", "failed 1", "landed 1"}
		if diff := cmp.Diff(want, statuses); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		if len(r.queue.landingList()) != len(r.git.pushes) {
			t.Errorf("%d landings for %d pushes", len(r.queue.landingList()), len(r.git.pushes))
		}
	})
}

// The base branch moves between the batch's checks and its push: the
// lease refuses the push, the batch is void (rebuilt), and a new batch
// on the moved base lands; nothing is forced.
func TestLanderBaseMovedAtPush(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, _ := newLanderRig(t)
		_, h1 := r.queuePull(1, "a.txt")
		moved := commitID("someone else pushed")
		r.git.moveOnPush = moved
		serveUntilIdle(t, r.d)

		if r.git.refused != 1 {
			t.Errorf("%d pushes refused, want 1", r.git.refused)
		}
		bs := r.queue.batchList()
		var got []string
		for _, b := range bs {
			got = append(got, b.Status+" on "+b.Base)
		}
		if diff := cmp.Diff([]string{"rebuilt on " + baseCommit("main"), "landed on " + moved}, got); diff != "" {
			t.Fatalf("batches (-want +got):\n%s", diff)
		}
		if !strings.Contains(bs[0].Error, "moved") {
			t.Errorf("void batch's error %q", bs[0].Error)
		}
		if len(r.git.pushes) != 1 || !strings.HasPrefix(r.git.pushes[0], "main "+moved+" ") {
			t.Errorf("pushes %q, want one over the moved base", r.git.pushes)
		}
		if r.git.parent[r.git.head("main")] != moved || !slices.Equal(r.git.landed("main"), []string{h1}) {
			t.Error("main is not the pull squashed onto the moved base")
		}
		if len(r.queue.landingList()) != 1 {
			t.Errorf("landings %+v, want one", r.queue.landingList())
		}
	})
}

// The base branch moves while the batch's checks run: the lander sees
// it before pushing, voids the batch and lands a new one on the moved
// base; no push is even tried over the old one.
func TestLanderBaseMovedWhileTheBatchRuns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, s := newLanderRig(t)
		_, h1 := r.queuePull(1, "a.txt")
		gate := make(chan struct{})
		r.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(r.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := serveRig(t, r.d)
		synctest.Wait()
		moved := commitID("someone else pushed")
		r.git.mu.Lock()
		r.git.heads = map[string]string{"main": moved}
		r.git.mu.Unlock()
		close(gate)
		synctest.Wait()
		stop()

		var got []string
		for _, b := range r.queue.batchList() {
			got = append(got, b.Status+" on "+b.Base)
		}
		if diff := cmp.Diff([]string{"rebuilt on " + baseCommit("main"), "landed on " + moved}, got); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		if r.git.refused != 0 || len(r.git.pushes) != 1 || !slices.Equal(r.git.landed("main"), []string{h1}) {
			t.Errorf("refused %d, pushes %q, on main %q", r.git.refused, r.git.pushes, r.git.landed("main"))
		}
	})
}

// A batch that failed before, whose bisection state.json lost, is not
// run again: the lander bisects it from its failed record at once (not
// at the next poll), ejects the culprit and lands the rest.
func TestLanderBisectsAgainAfterLosingItsMemory(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, s := newLanderRig(t)
		_, h1 := r.queuePull(1, "a.txt")
		p2, h2 := r.queuePull(2, "b.txt")
		s.culprit = h2
		base := baseCommit("main")
		bp := []forge.BatchPull{{Pull: "at://did:plc:author/" + forge.CollectionPull + "/3p1", Commit: h1}, {Pull: p2, Commit: h2}}
		key := forge.BatchKey(testRepo, base, bp)
		r.queue.batches[key] = forge.Batch{Type: forge.CollectionBatch, Repo: testRepo, Ref: "refs/heads/main", Base: base, Pulls: bp,
			Squashed: commitID("lost"), Status: forge.BatchFailed, Error: "workflow batch: failure", CreatedAt: "2026-01-01T00:01:00.000Z"}
		r.queue.born[key] = 0
		stop := serveRig(t, r.d)
		synctest.Wait()
		stop()

		if diff := cmp.Diff([]string{h1}, r.git.landed("main")); diff != "" {
			t.Errorf("pulls on main (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]string{p2: forge.EjectBatch}, r.queue.reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
		var got []string
		for _, b := range r.queue.batchList() {
			got = append(got, fmt.Sprintf("%s %d", b.Status, len(b.Pulls)))
		}
		if diff := cmp.Diff([]string{"failed 2", "landed 1", "failed 1"}, got); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
	})
}

// A pull whose head moves while its batch runs is not pushed: the batch
// is void and, with the pull ejected, the rest land.
func TestLanderHeadMovesDuringBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, s := newLanderRig(t)
		_, h1 := r.queuePull(1, "a.txt")
		p2, _ := r.queuePull(2, "b.txt")
		gate := make(chan struct{})
		s.r.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(r.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch &&
				len(r.queue.batch(uri.RecordKey().String()).Pulls) == 2 {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := serveRig(t, r.d)
		synctest.Wait()
		p := r.queue.pulls[syntax.ATURI(p2)]
		p.Head.Commit = commitID("pushed again")
		r.queue.setPull(p2, p)
		close(gate)
		synctest.Wait()
		stop()

		var got []string
		for _, b := range r.queue.batchList() {
			got = append(got, fmt.Sprintf("%s %d", b.Status, len(b.Pulls)))
		}
		if diff := cmp.Diff([]string{"rebuilt 2", "landed 1"}, got); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]string{p2: forge.EjectHeadMoved}, r.queue.reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
		if !slices.Equal(r.git.landed("main"), []string{h1}) {
			t.Errorf("pulls on main %q", r.git.landed("main"))
		}
	})
}

// A restart of the lander mid-batch, at either side of the push: the
// successor (same state directory, same source and records) finishes
// the batch; it lands once.
func TestLanderRestartMidBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// crash sets up the first process's end.
		crash func(r *rig, s *queueScript) (cleanup func())
	}{
		{"while the batch runs", func(r *rig, s *queueScript) func() {
			gate := make(chan struct{})
			r.exec.Script = func(runID, id string) fakeexec.Step {
				if uri := syntax.ATURI(r.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch {
					return fakeexec.Step{Gate: gate}
				}
				return s.step(runID, id)
			}
			return func() { close(gate) }
		}},
		{"after the push, before the landing", func(r *rig, _ *queueScript) func() {
			r.queue.mu.Lock()
			r.queue.failPut[forge.CollectionLanding] = errDown
			r.queue.mu.Unlock()
			return func() {
				r.queue.mu.Lock()
				delete(r.queue.failPut, forge.CollectionLanding)
				r.queue.mu.Unlock()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				r, s := newLanderRig(t)
				_, h1 := r.queuePull(1, "a.txt")
				_, h2 := r.queuePull(2, "b.txt")
				cleanup := tc.crash(r, s)
				serveUntilIdle(t, r.d)
				if bs := r.queue.batchList(); len(bs) != 1 || bs[0].Status != forge.BatchRunning {
					t.Fatalf("before the restart: batches %+v, want one running", bs)
				}
				cleanup()
				serveUntilIdle(t, r.successor(t))

				if diff := cmp.Diff([]string{h1, h2}, r.git.landed("main")); diff != "" {
					t.Errorf("pulls on main (-want +got):\n%s", diff)
				}
				if len(r.git.pushes) != 1 || len(r.queue.landingList()) != 1 {
					t.Errorf("%d pushes and %d landings, want one of each", len(r.git.pushes), len(r.queue.landingList()))
				}
				if bs := r.queue.batchList(); len(bs) != 1 || bs[0].Status != forge.BatchLanded {
					t.Errorf("batches %+v, want the one landed", bs)
				}
				if len(r.queue.reasons()) != 0 {
					t.Errorf("ejections %v", r.queue.reasons())
				}
			})
		})
	}
}

// A batch whose squashed commit left the cache (the mirror wiped) is
// squashed again from its record to the same commit, and lands.
func TestLanderResquashesAfterTheCacheIsWiped(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, s := newLanderRig(t)
		_, h1 := r.queuePull(1, "a.txt")
		gate := make(chan struct{})
		r.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(r.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := serveRig(t, r.d)
		synctest.Wait()
		r.git.wipe()
		close(gate)
		synctest.Wait()
		stop()
		if !slices.Equal(r.git.landed("main"), []string{h1}) || len(r.queue.batchList()) != 1 {
			t.Errorf("pulls on main %q, batches %+v", r.git.landed("main"), r.queue.batchList())
		}
	})
}

// The lander whose repository's landers do not name it (the fallback
// lander: the first runner, landers naming none of the runners) pushes
// nothing: every queued pull is ejected saying so, no pre-flight or
// batch runs.
func TestLanderNotAmongLandersEjects(t *testing.T) {
	t.Parallel()
	for _, landers := range [][]string{nil, {"did:plc:other"}} {
		t.Run(fmt.Sprintf("landers %q", landers), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				r, _ := newLanderRig(t)
				r.in.repos = []forge.Record[forge.Repo]{queueRepo([]string{rigRunner}, landers)}
				p1, h1 := r.queuePull(1, "a.txt")
				p2, _ := r.queuePull(2, "b.txt")
				serveUntilIdle(t, r.d)

				if len(r.git.pushes) != 0 || len(r.queue.batchList()) != 0 || len(r.queue.landingList()) != 0 {
					t.Errorf("pushes %q, batches %+v, landings %+v; want none", r.git.pushes, r.queue.batchList(), r.queue.landingList())
				}
				if diff := cmp.Diff(map[string]string{p1: forge.EjectNotLander, p2: forge.EjectNotLander}, r.queue.reasons()); diff != "" {
					t.Errorf("ejections (-want +got):\n%s", diff)
				}
				if ej := r.queue.ejection(p1); ej.Commit != h1 || !strings.Contains(ej.Detail, rigRunner+") is not among the repository's landers") {
					t.Errorf("ejection %+v: want the approved commit and a detail naming this runner", ej)
				}
				if len(r.pds.writes()) != 0 {
					t.Errorf("checks written (a pre-flight ran): %q", r.pds.writes())
				}
			})
		})
	}
}

// The owner takes the lander out of landers while a batch runs: the
// batch is not pushed but void, and its pulls are ejected (notLander).
func TestLanderLosesItsGrantDuringBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, s := newLanderRig(t)
		p1, _ := r.queuePull(1, "a.txt")
		gate := make(chan struct{})
		r.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(r.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := serveRig(t, r.d)
		synctest.Wait()
		r.in.mu.Lock()
		r.in.repos = []forge.Record[forge.Repo]{queueRepo([]string{rigRunner}, nil)}
		r.in.mu.Unlock()
		close(gate)
		synctest.Wait()
		stop()

		if len(r.git.pushes) != 0 || len(r.queue.landingList()) != 0 {
			t.Errorf("pushes %q, landings %+v; want none", r.git.pushes, r.queue.landingList())
		}
		if bs := r.queue.batchList(); len(bs) != 1 || bs[0].Status != forge.BatchRebuilt || !strings.Contains(bs[0].Error, "no longer among the repository's landers") {
			t.Errorf("batches %+v, want the one void, saying why", bs)
		}
		if diff := cmp.Diff(map[string]string{p1: forge.EjectNotLander}, r.queue.reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
	})
}

// The author retargets a queued pull while its batch runs: the batch is
// void, not pushed onto either branch; the pull is ejected (baseChanged)
// and the rest land on the approved base.
func TestLanderBaseChangesDuringBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, s := newLanderRig(t)
		_, h1 := r.queuePull(1, "a.txt")
		p2, _ := r.queuePull(2, "b.txt")
		gate := make(chan struct{})
		r.exec.Script = func(runID, id string) fakeexec.Step {
			if uri := syntax.ATURI(r.exec.Session(runID).Spec().Annotations["knotless.dev/event"]); uri.Collection().String() == forge.CollectionBatch &&
				len(r.queue.batch(uri.RecordKey().String()).Pulls) == 2 {
				return fakeexec.Step{Gate: gate}
			}
			return s.step(runID, id)
		}
		stop := serveRig(t, r.d)
		synctest.Wait()
		p := r.queue.pulls[syntax.ATURI(p2)]
		p.Base = "release"
		r.queue.setPull(p2, p)
		close(gate)
		synctest.Wait()
		stop()

		var got []string
		for _, b := range r.queue.batchList() {
			got = append(got, fmt.Sprintf("%s %d %s", b.Status, len(b.Pulls), b.Ref))
		}
		if diff := cmp.Diff([]string{"rebuilt 2 refs/heads/main", "landed 1 refs/heads/main"}, got); diff != "" {
			t.Errorf("batches (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[string]string{p2: forge.EjectBaseChanged}, r.queue.reasons()); diff != "" {
			t.Errorf("ejections (-want +got):\n%s", diff)
		}
		if !slices.Equal(r.git.landed("main"), []string{h1}) || len(r.git.landed("release")) != 0 {
			t.Errorf("pulls on main %q, on release %q", r.git.landed("main"), r.git.landed("release"))
		}
	})
}

// A runner that is named but not the lander leaves the queue alone: no
// pre-flight, no record, no push.
func TestNotTheLanderDoesNothing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, _ := newLanderRig(t)
		r.in.repos = []forge.Record[forge.Repo]{queueRepo([]string{"did:plc:other", rigRunner}, []string{"did:plc:other", rigRunner})}
		r.queuePull(1, "a.txt")
		serveUntilIdle(t, r.d)
		if len(r.queue.puts) != 0 || len(r.git.pushes) != 0 {
			t.Errorf("records written %q, pushes %q", r.queue.puts, r.git.pushes)
		}
		if len(r.pds.writes()) != 0 {
			t.Errorf("checks written: %q", r.pds.writes())
		}
	})
}

// Config.QueueBatch bounds a batch: three ready pulls with a bound of two
// land as a batch of the first two, then one of the third, in queue order.
func TestLanderBatchBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r, _ := newLanderRig(t)
		r.d.cfg.QueueBatch = 2
		p1, h1 := r.queuePull(1, "a.txt")
		p2, h2 := r.queuePull(2, "b.txt")
		p3, h3 := r.queuePull(3, "c.txt")
		serveUntilIdle(t, r.d)

		if diff := cmp.Diff([]string{h1, h2, h3}, r.git.landed("main")); diff != "" {
			t.Errorf("pulls on main (-want +got):\n%s", diff)
		}
		bs := r.queue.batchList()
		slices.SortFunc(bs, func(a, b forge.Batch) int { return len(b.Pulls) - len(a.Pulls) })
		if len(bs) != 2 || !slices.Equal(batchPulls(bs[0]), []string{p1, p2}) || !slices.Equal(batchPulls(bs[1]), []string{p3}) {
			t.Fatalf("batches %+v, want pulls 1 and 2, then 3", bs)
		}
		for _, b := range bs {
			if b.Status != forge.BatchLanded {
				t.Errorf("batch of %v: %s, want landed", batchPulls(b), b.Status)
			}
		}
		if len(r.git.pushes) != 2 {
			t.Errorf("pushes %q, want two", r.git.pushes)
		}
	})
}
