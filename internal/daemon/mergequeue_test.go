package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/lander"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/tests/gitrepo"
	"knotless.dev/run/tests/pds"
)

// mqWorld is a world whose repository has a merge queue: its source is
// a bare repository on disk (pushed to over file://), the runner may
// land, and an author has a fork to open pulls from.
type mqWorld struct {
	*world
	origin string
	author *pds.Account
	fork   *gitrepo.Repo
}

// mqWorkflows: pre.yaml is the pre-flight (fails when the pull adds
// bad-preflight, and when it is given the operator's TOKEN), batch.yaml the batch (fails when x.txt and y.txt are
// both there, and when it is given the operator's TOKEN), post.yaml runs
// on pushes to main (landings among them) and shows whether it got
// TOKEN.
var mqWorkflows = map[string]string{
	".knotless/workflows/pre.yaml": workflowFile(`
on: pull
queue: first
secrets: [TOKEN]
steps:
  - run: test -z "${TOKEN:-}"
    secrets: [TOKEN]
  - run: test ! -e bad-preflight
`),
	".knotless/workflows/batch.yaml": workflowFile(`
on: batch
secrets: [TOKEN]
steps:
  - run: test -z "${TOKEN:-}"
    secrets: [TOKEN]
  - run: test ! -e x.txt || test ! -e y.txt
`),
	".knotless/workflows/post.yaml": workflowFile(`
on: push
branches: [main]
secrets: [TOKEN]
steps:
  - run: test "$TOKEN" = operator-token
    secrets: [TOKEN]
`),
	"base.txt": "base\n",
}

func newMQWorld(t *testing.T, runners, landers []string) *mqWorld {
	t.Helper()
	w := newWorld(t)
	ctx := context.Background()
	w.Src.Commit("main", mqWorkflows)
	m := &mqWorld{world: w, origin: filepath.Join(t.TempDir(), "origin.git")}
	if out, err := exec.Command("git", "clone", "--quiet", "--bare", w.Src.Dir, m.origin).CombinedOutput(); err != nil {
		t.Fatalf("git clone --bare: %v\n%s", err, out)
	}
	if runners == nil {
		runners = []string{w.Runner.DID.String()}
	}
	if landers == nil {
		landers = []string{w.Runner.DID.String()}
	}
	w.Put(w.Owner, forge.CollectionRepo, "hello", forge.Repo{
		Type: forge.CollectionRepo, Name: "hello", Source: "file://" + m.origin, DefaultBranch: "main",
		Runners: runners, Landers: landers, CreatedAt: forge.Now(),
	})
	var err error
	if m.author, err = srv.CreateAccount(ctx, "author"); err != nil {
		t.Fatal(err)
	}
	m.fork = w.Src.Clone(t)
	return m
}

func (m *mqWorld) config(mod ...func(*daemon.Config)) daemon.Config {
	return m.world.config(append([]func(*daemon.Config){func(c *daemon.Config) {
		c.Lander.Queue, c.Lander.Batch = true, lander.DefaultBatch
		c.Scheduler.Secrets = []scheduler.OperatorSecret{{Name: "TOKEN", Value: "operator-token", Repos: []string{m.RepoURI.String()}}}
	}}, mod...)...)
}

// pull commits files on a new branch of the fork from from (default:
// the origin's main) and opens the pull.
func (m *mqWorld) pull(name, from string, files map[string]string) (syntax.ATURI, string) {
	m.t.Helper()
	if from == "" {
		from = m.head()
	}
	m.fork.Git("fetch", "--quiet", m.origin, "main")
	m.fork.Git("checkout", "--quiet", "-B", name, from)
	head := m.fork.Commit(name, files)
	return m.openPull(m.author, m.fork.Dir, name, head), head
}

// enqueue is the owner queueing the pull at commit onto main.
func (m *mqWorld) enqueue(pull syntax.ATURI, commit string) {
	m.t.Helper()
	m.enqueueOnto(pull, commit, "main")
}

// enqueueOnto is the owner queueing the pull at commit onto base ("":
// an entry of the older form, naming no base).
func (m *mqWorld) enqueueOnto(pull syntax.ATURI, commit, base string) {
	m.t.Helper()
	m.Put(m.Owner, forge.CollectionQueueEntry, "", forge.QueueEntry{
		Type: forge.CollectionQueueEntry, Repo: m.RepoURI.String(), Pull: pull.String(), Commit: commit, Base: base, CreatedAt: forge.Now(),
	})
}

// retarget is the pull's author changing its base branch.
func (m *mqWorld) retarget(pull syntax.ATURI, branch, head, base string) {
	m.t.Helper()
	m.Put(m.author, forge.CollectionPull, pull.RecordKey().String(), forge.Pull{
		Type: forge.CollectionPull, Repo: m.RepoURI.String(), Base: base,
		Head:  forge.PullHead{Source: "file://" + m.fork.Dir, Ref: "refs/heads/" + branch, Commit: head},
		Title: branch, State: forge.PullOpen, CreatedAt: forge.Now(),
	})
}

// pushMain commits files on the origin's main (through the source
// repository) and returns the new head.
func (m *mqWorld) pushMain(files map[string]string) string {
	m.t.Helper()
	m.Src.Git("fetch", "--quiet", m.origin, "main")
	m.Src.Git("checkout", "--quiet", "main")
	m.Src.Git("reset", "--quiet", "--hard", "FETCH_HEAD")
	m.Src.Commit("main", files)
	m.Src.Git("push", "--quiet", m.origin, "main")
	return m.head()
}

// branchHead is the origin's branch, or "" when there is none.
func (m *mqWorld) branchHead(branch string) string {
	m.t.Helper()
	out, err := exec.Command("git", "--git-dir", m.origin, "rev-parse", "--verify", "--quiet", "refs/heads/"+branch).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// head is the origin's main.
func (m *mqWorld) head() string {
	m.t.Helper()
	out, err := exec.Command("git", "--git-dir", m.origin, "rev-parse", "refs/heads/main").Output()
	if err != nil {
		m.t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// subjects lists the first lines of the origin's main from base up.
func (m *mqWorld) subjects(since string) []string {
	m.t.Helper()
	out, err := exec.Command("git", "--git-dir", m.origin, "log", "--reverse", "--format=%s", since+"..refs/heads/main").Output()
	if err != nil {
		m.t.Fatal(err)
	}
	s := strings.TrimSpace(string(out))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func list[T any](m *mqWorld, did syntax.DID, coll string) []forge.Record[T] {
	m.t.Helper()
	recs, bad, err := pdsclient.List[T](context.Background(), m.Reader, did, coll)
	if err != nil {
		m.t.Fatal(err)
	}
	if len(bad) > 0 {
		m.t.Fatalf("invalid %s records: %v", coll, bad)
	}
	return recs
}

// waitFor polls cond until it holds.
func (m *mqWorld) waitFor(what string, timeout time.Duration, cond func() bool) {
	m.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			m.t.Fatalf("no %s after %s\nlog:\n%s", what, timeout, m.logText())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ejections are the lander's ejection records, by pull.
func (m *mqWorld) ejections(lander syntax.DID) map[string]forge.Ejection {
	out := map[string]forge.Ejection{}
	for _, r := range list[forge.Ejection](m, lander, forge.CollectionEjection) {
		out[r.Value.Pull] = r.Value
	}
	return out
}

// TestMergeQueueLandsInOrder: two queued pulls pass their pre-flight
// (run once, although it is also their on: pull work),
// land as one batch in queue order (one squashed commit each), the
// batch's checks get no secret, and the landing runs main's push
// workflow as the owner's push, with the secret.
func TestMergeQueueLandsInOrder(t *testing.T) {
	t.Parallel()
	m := newMQWorld(t, nil, nil)
	base := m.head()
	p1, c1 := m.pull("one", "", map[string]string{"one.txt": "1\n"})
	p2, c2 := m.pull("two", "", map[string]string{"two.txt": "2\n"})
	m.enqueue(p1, c1)
	m.enqueue(p2, c2)
	// With --pulls, pre.yaml (on: pull and queue: first) is also the
	// pulls' own work: it runs once per pull all the same.
	m.start(m.config(func(c *daemon.Config) { c.Sources.Pulls = true }))

	m.waitFor("landing", 2*time.Minute, func() bool {
		return len(list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)) > 0
	})
	for _, c := range []string{c1, c2} {
		// Queued only when it waited for the worker.
		got := m.checkLog.statuses("pre", c)
		if diff := cmp.Diff([]string{"queued", "running", "success"}, got); diff != "" && !slices.Equal(got, []string{"running", "success"}) {
			t.Errorf("pre check writes of %s (-want +got):\n%s", c, diff)
		}
	}
	if diff := cmp.Diff([]string{"one", "two"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	landings := list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)
	if len(landings) != 1 || landings[0].Value.Old != base || landings[0].Value.New != m.head() {
		t.Fatalf("landings: %+v; want one, %s to %s", landings, base, m.head())
	}
	batches := list[forge.Batch](m, m.Runner.DID, forge.CollectionBatch)
	if len(batches) != 1 || batches[0].Value.Status != forge.BatchLanded {
		t.Fatalf("batches: %+v", batches)
	}
	want := []forge.BatchPull{{Pull: p1.String(), Commit: c1}, {Pull: p2.String(), Commit: c2}}
	if diff := cmp.Diff(want, batches[0].Value.Pulls); diff != "" {
		t.Errorf("batch pulls (-want +got):\n%s", diff)
	}
	if _, c := m.waitFinal("batch", m.head(), time.Minute); c.Status != "success" || c.Subject.Kind != forge.KindBatch {
		t.Errorf("batch check: %+v; want success of kind batch (no secret given)", c)
	}
	for _, c := range []string{c1, c2} {
		if _, pre := m.waitFinal("pre", c, time.Minute); pre.Status != "success" {
			t.Errorf("pre-flight of %s: %+v", c, pre)
		}
	}
	// The landing is a trusted push: main's push workflow runs with the
	// operator's secret.
	if _, post := m.waitFinal("post", m.head(), time.Minute); post.Status != "success" || post.Subject.Event != landings[0].URI.String() {
		t.Errorf("post check: %+v; want success for the landing %s", post, landings[0].URI)
	}
	if ej := m.ejections(m.Runner.DID); len(ej) != 0 {
		t.Errorf("ejections: %+v", ej)
	}
}

// TestMergeQueueEjects: each way out of the queue says why: a conflict
// with the base, a conflict with an earlier pull of the batch, a failing
// pre-flight, a pull that fails only in a batch (bisected: the rest
// lands), and a head that moved after it was queued.
func TestMergeQueueEjects(t *testing.T) {
	t.Parallel()
	m := newMQWorld(t, nil, nil)
	oldBase := m.head()
	// main moves after the fork point of "clash": base.txt differs.
	m.Src.Git("fetch", "--quiet", m.origin, "main")
	m.Src.Git("checkout", "--quiet", "main")
	m.Src.Git("reset", "--quiet", "--hard", "FETCH_HEAD")
	m.Src.Commit("main", map[string]string{"base.txt": "moved\n"})
	m.Src.Git("push", "--quiet", m.origin, "main")
	base := m.head()

	clash, cClash := m.pull("clash", oldBase, map[string]string{"base.txt": "clash\n"})
	first, cFirst := m.pull("first", "", map[string]string{"c.txt": "first\n"})
	second, cSecond := m.pull("second", "", map[string]string{"c.txt": "second\n"})
	bad, cBad := m.pull("bad", "", map[string]string{"bad-preflight": "x\n"})
	x, cX := m.pull("x", "", map[string]string{"x.txt": "x\n"})
	y, cY := m.pull("y", "", map[string]string{"y.txt": "y\n"})
	moved, cMoved := m.pull("moved", "", map[string]string{"m.txt": "1\n"})
	for _, q := range []struct {
		p syntax.ATURI
		c string
	}{{clash, cClash}, {first, cFirst}, {second, cSecond}, {bad, cBad}, {x, cX}, {y, cY}} {
		m.enqueue(q.p, q.c)
	}
	// The author pushes again after the owner queued "moved".
	m.enqueue(moved, cMoved)
	newHead := m.fork.Commit("moved", map[string]string{"m.txt": "2\n"})
	m.Put(m.author, forge.CollectionPull, moved.RecordKey().String(), forge.Pull{
		Type: forge.CollectionPull, Repo: m.RepoURI.String(), Base: "main",
		Head:  forge.PullHead{Source: "file://" + m.fork.Dir, Ref: "refs/heads/moved", Commit: newHead},
		Title: "moved", State: forge.PullOpen, CreatedAt: forge.Now(),
	})
	m.start(m.config())

	m.waitFor("five ejections", 3*time.Minute, func() bool { return len(m.ejections(m.Runner.DID)) >= 5 })
	m.waitFor("first and x landed", 2*time.Minute, func() bool { return len(m.subjects(base)) == 2 })
	ej := m.ejections(m.Runner.DID)
	for _, c := range []struct {
		pull   syntax.ATURI
		reason string
		detail string
	}{
		{clash, forge.EjectConflictBase, "base.txt"},
		{second, forge.EjectConflictPull, first.String()},
		{bad, forge.EjectPreflight, "workflow pre: failure"},
		{y, forge.EjectBatch, "workflow batch: failure"},
		{moved, forge.EjectHeadMoved, newHead[:12]},
	} {
		got, ok := ej[c.pull.String()]
		if !ok || got.Reason != c.reason || !strings.Contains(got.Detail, c.detail) {
			t.Errorf("ejection of %s: %+v; want reason %s naming %q", c.pull, got, c.reason, c.detail)
		}
	}
	if diff := cmp.Diff([]string{"first", "x"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	if _, ok := ej[x.String()]; ok {
		t.Errorf("x was ejected: %+v", ej[x.String()])
	}
}

// TestMergeQueueTwoRunners: both runners are named; only the lander
// (the first named that may push) lands, once, and each batch workflow
// has one check.
func TestMergeQueueTwoRunners(t *testing.T) {
	t.Parallel()
	needPDS(t)
	ctx := context.Background()
	other, err := srv.CreateAccount(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	otherPassword, err := other.AppPassword(ctx, "knotless-run")
	if err != nil {
		t.Fatal(err)
	}
	m := newMQWorld(t, nil, nil)
	// other is named first but may not push: m.Runner is the lander.
	m.Put(m.Owner, forge.CollectionRepo, "hello", forge.Repo{
		Type: forge.CollectionRepo, Name: "hello", Source: "file://" + m.origin, DefaultBranch: "main",
		Runners: []string{other.DID.String(), m.Runner.DID.String()}, Landers: []string{m.Runner.DID.String()}, CreatedAt: forge.Now(),
	})
	base := m.head()
	p1, c1 := m.pull("one", "", map[string]string{"one.txt": "1\n"})
	m.enqueue(p1, c1)
	m.start(m.config())
	m.start(m.config(func(c *daemon.Config) {
		c.Account.Runner, c.Account.Password = other.DID, otherPassword
		c.StateDir, c.CacheDir = t.TempDir(), t.TempDir()
		c.Engine.Executor = shell.New(shell.Config{Root: t.TempDir()})
	}))
	m.waitFor("landing", 2*time.Minute, func() bool {
		return len(list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)) > 0
	})
	if diff := cmp.Diff([]string{"one"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	m.waitFinal("batch", m.head(), time.Minute)
	if n := len(list[forge.Batch](m, other.DID, forge.CollectionBatch)) + len(list[forge.Landing](m, other.DID, forge.CollectionLanding)); n != 0 {
		t.Errorf("the runner that is not the lander wrote %d batch or landing records", n)
	}
	var batchChecks int
	for _, c := range append(list[forge.Check](m, m.Runner.DID, forge.CollectionCheck), list[forge.Check](m, other.DID, forge.CollectionCheck)...) {
		if c.Value.Subject.Kind == forge.KindBatch {
			batchChecks++
		}
	}
	if batchChecks != 1 {
		t.Errorf("%d batch checks, want 1", batchChecks)
	}
}

// TestMergeQueueBaseChangedAfterQueueing: the author retargets a queued
// pull at another branch after the owner queued it onto main; the lander
// lands nothing on either branch for it and ejects it (baseChanged). An
// entry naming no base is ejected too (noBase); the pull queued as
// approved lands.
func TestMergeQueueBaseChangedAfterQueueing(t *testing.T) {
	t.Parallel()
	m := newMQWorld(t, nil, nil)
	base := m.head()
	m.Src.Git("push", "--quiet", m.origin, base+":refs/heads/release")
	good, cGood := m.pull("good", "", map[string]string{"good.txt": "1\n"})
	moved, cMoved := m.pull("moved", "", map[string]string{"moved.txt": "1\n"})
	old, cOld := m.pull("old", "", map[string]string{"old.txt": "1\n"})
	m.enqueue(good, cGood)
	m.enqueue(moved, cMoved)
	m.enqueueOnto(old, cOld, "")
	// After the owner queued it onto main, the author points it at
	// release.
	m.retarget(moved, "moved", cMoved, "release")
	m.start(m.config())

	m.waitFor("two ejections", 3*time.Minute, func() bool { return len(m.ejections(m.Runner.DID)) >= 2 })
	m.waitFor("good landed", 2*time.Minute, func() bool { return len(m.subjects(base)) == 1 })
	ej := m.ejections(m.Runner.DID)
	if got := ej[moved.String()]; got.Reason != forge.EjectBaseChanged || got.Commit != cMoved ||
		!strings.Contains(got.Detail, `base changed after queueing: the entry approved "main", the pull now targets "release"`) {
		t.Errorf("ejection of the retargeted pull: %+v", got)
	}
	if got := ej[old.String()]; got.Reason != forge.EjectNoBase || !strings.Contains(got.Detail, "names no base branch") {
		t.Errorf("ejection of the entry without base: %+v", got)
	}
	if diff := cmp.Diff([]string{"good"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	if got := m.branchHead("release"); got != base {
		t.Errorf("release moved to %s; want it untouched at %s", got, base)
	}
	for _, b := range list[forge.Batch](m, m.Runner.DID, forge.CollectionBatch) {
		for _, p := range b.Value.Pulls {
			if p.Pull != good.String() {
				t.Errorf("batch %s took %s", b.URI, p.Pull)
			}
		}
	}
}

// TestMergeQueueEjectionNamesManyNonASCIIPaths: a pull conflicting with
// the base on many paths of multi-byte characters is ejected with a
// detail cut to the lexicon's 3000 bytes at a character, not inside one
// (which the lexicon refuses, on every reconcile, stopping the queue);
// the next pull lands.
func TestMergeQueueEjectionNamesManyNonASCIIPaths(t *testing.T) {
	t.Parallel()
	m := newMQWorld(t, nil, nil)
	const n = 120
	names := make([]string, n)
	files := map[string]string{}
	for i := range names {
		names[i] = fmt.Sprintf("日本語ファイル-%03d.txt", i)
		files[names[i]] = "base\n"
	}
	// The detail the lander writes, uncut, must be cut inside a
	// character at 2997 bytes for this test to mean anything.
	if full := "conflicts with the base branch: conflicting paths: " + strings.Join(names, ", "); len(full) <= 3000 || utf8.RuneStart(full[2997]) {
		t.Fatalf("the fixture's detail (%d bytes) is not cut inside a character at 2997: change the names", len(full))
	}
	fork := m.pushMain(files)
	for k := range files {
		files[k] = "main\n"
	}
	base := m.pushMain(files)
	for k := range files {
		files[k] = "pull\n"
	}
	clash, cClash := m.pull("clash", fork, files)
	next, cNext := m.pull("next", "", map[string]string{"next.txt": "1\n"})
	m.enqueue(clash, cClash)
	m.enqueue(next, cNext)
	m.start(m.config())

	m.waitFor("the ejection", 3*time.Minute, func() bool { return len(m.ejections(m.Runner.DID)) > 0 })
	m.waitFor("next landed", 2*time.Minute, func() bool { return len(m.subjects(base)) == 1 })
	got := m.ejections(m.Runner.DID)[clash.String()]
	if got.Reason != forge.EjectConflictBase || !utf8.ValidString(got.Detail) || len(got.Detail) > 3000 ||
		!strings.HasSuffix(got.Detail, "...") || !strings.Contains(got.Detail, names[0]+", "+names[1]) {
		t.Errorf("ejection: reason %s, %d bytes, valid UTF-8 %v, detail %q", got.Reason, len(got.Detail), utf8.ValidString(got.Detail), got.Detail)
	}
	if len(got.Detail) < 2990 {
		t.Errorf("detail of %d bytes: cut shorter than a character from 3000", len(got.Detail))
	}
	if diff := cmp.Diff([]string{"next"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	if strings.Contains(m.logText(), "does not match its lexicon") || strings.Contains(m.logText(), "maxLength") {
		t.Errorf("a record was refused by its lexicon:\n%s", m.logText())
	}
}

// TestMergeQueuePushCredentialBoundToHost: the owner points the
// repository's source at a git server of its own (another host than
// the one the operator bound the push credential to). The batch passes
// but its push offers that server nothing and fails naming the
// credential configuration; main does not move. Pointed back at the
// bound server, the lander pushes there with the token. The token is in
// no log, record, or file of the runner's state and cache.
func TestMergeQueuePushCredentialBoundToHost(t *testing.T) {
	t.Parallel()
	m := newMQWorld(t, nil, nil)
	root := filepath.Dir(m.origin)
	bound := gitrepo.Serve(t, "", root)
	owners := gitrepo.Serve(t, "127.0.0.2", root)
	token := filepath.Join(t.TempDir(), "push-token")
	if err := os.WriteFile(token, []byte(bound.User+":"+bound.Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cred, err := mirror.LoadPushCredential(bound.URL + "/origin.git=" + token)
	if err != nil {
		t.Fatal(err)
	}
	source := func(url string) {
		m.Put(m.Owner, forge.CollectionRepo, "hello", forge.Repo{
			Type: forge.CollectionRepo, Name: "hello", Source: url, DefaultBranch: "main",
			Runners: []string{m.Runner.DID.String()}, Landers: []string{m.Runner.DID.String()}, CreatedAt: forge.Now(),
		})
	}
	cfg := m.config(func(c *daemon.Config) {
		c.PushCredentials = mirror.PushCredentials{cred}
		c.Git.Policy.AllowHTTP = true
	})
	source(owners.URL + "/origin.git")
	base := m.head()
	p1, c1 := m.pull("one", "", map[string]string{"one.txt": "1\n"})
	m.enqueue(p1, c1)
	stop := m.start(cfg)

	m.waitFor("the push refused, or made", 3*time.Minute, func() bool {
		return strings.Contains(m.logText(), "no push credential is bound") || m.head() != base
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := owners.Offered(); len(got) != 0 {
		t.Errorf("the owner's server was offered %q", got)
	}
	if got := bound.Offered(); len(got) != 0 {
		t.Errorf("the bound server was offered %q before any push to it", got)
	}
	if m.head() != base {
		t.Fatalf("main moved to %s through the owner's server", m.head())
	}
	if log := m.logText(); !strings.Contains(log, "--push-credential binds "+cred.String()) {
		t.Errorf("the refusal does not name the credential configuration:\n%s", log)
	}

	source(bound.URL + "/origin.git")
	m.start(cfg)
	m.waitFor("landing", 2*time.Minute, func() bool {
		return len(list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)) > 0
	})
	if diff := cmp.Diff([]string{"one"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	if got := bound.Offered(); len(got) == 0 || slices.ContainsFunc(got, func(s string) bool { return s != bound.User+":"+bound.Password }) {
		t.Errorf("the bound server was offered %q; want the token only", got)
	}
	if got := owners.Offered(); len(got) != 0 {
		t.Errorf("the owner's server was offered %q", got)
	}
	secret := bound.Password
	if strings.Contains(m.logText(), secret) {
		t.Error("the daemon's log holds the token")
	}
	for _, dir := range []string{m.stateDir, m.cacheDir, m.shellRoot} {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), secret) {
				t.Errorf("%s holds the token", p)
			}
			return nil
		})
	}
	for _, coll := range []string{forge.CollectionBatch, forge.CollectionEjection, forge.CollectionLanding, forge.CollectionCheck} {
		recs, _, err := pdsclient.List[map[string]any](context.Background(), m.Reader, m.Runner.DID, coll)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if b, _ := json.Marshal(r.Value); strings.Contains(string(b), secret) {
				t.Errorf("%s holds the token", r.URI)
			}
		}
	}
}
