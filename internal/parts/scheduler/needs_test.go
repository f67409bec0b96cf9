package scheduler

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/mask"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// neededJobs are the jobs, in Plan's order, of the workflows srcs (by
// name) for ev, from repo (nil: none).
func neededJobs(t *testing.T, ev work.Event, repo job.Repo, srcs map[string]string) map[string]*job.Job {
	t.Helper()
	var wfs []*workflow.Workflow
	for name, src := range srcs {
		wf, err := workflow.Parse(".knotless/workflows/"+name+".yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		wfs = append(wfs, wf)
	}
	if errs := workflow.CheckNeeds(wfs); len(errs) > 0 {
		t.Fatal(errs)
	}
	jobs := map[string]*job.Job{}
	for _, wf := range workflow.Plan(wfs) {
		jobs[wf.Name] = job.New(ev, wf, repo, ev.Commit)
	}
	return jobs
}

var buildAndTest = map[string]string{
	"build": "on: push\nartifacts: [bin/*]\nsteps: [{run: make}]\n",
	"test":  "on: push\nneeds: [build]\nsteps: [{run: make test}]\n",
}

// TestNeedsHoldTheQueue: a run waits, unclaimed, while a run it needs
// of the same event is in hand, and its queued check says so; a run of
// another event, or of no needs, is not held.
func TestNeedsHoldTheQueue(t *testing.T) {
	t.Parallel()
	q := newQueue()
	jobs := neededJobs(t, rig.Push("3k1", "c1"), nil, buildAndTest)
	otherEv := rig.Push("3k2", "c2")
	otherEv.Ref = "refs/heads/dev" // another branch: nothing supersedes
	other := neededJobs(t, otherEv, nil, buildAndTest)
	q.add(one(jobs["build"]))
	if got := q.waitsFor(jobs["test"]); got != "waits for build" {
		t.Errorf("waitsFor: %q, want waits for build", got)
	}
	q.add(one(jobs["test"]))
	q.add(one(other["test"]))
	var claimed []string
	for t := q.claim(); t != nil; t = q.claim() {
		claimed = append(claimed, t.Key)
	}
	if diff := cmp.Diff([]string{jobs["build"].Key, other["test"].Key}, claimed); diff != "" {
		t.Errorf("claimed while build is in hand (-want +got):\n%s", diff)
	}
	q.end(q.running[jobs["build"].Key])
	if got := q.claim(); got == nil || got.Key != jobs["test"].Key {
		t.Errorf("after build ended, claimed %v, want test", got)
	}
	if q.waitsFor(other["build"]) != "" {
		t.Error("a workflow without needs waits for something")
	}
}

// TestNeedsVerdict: a run goes when every run it needs (each leg of a
// matrix) ended success; else it names the first that did not.
func TestNeedsVerdict(t *testing.T) {
	t.Parallel()
	ev := rig.Push("3k1", "c1")
	jobs := neededJobs(t, ev, nil, map[string]string{
		"build":  "on: push\nmatrix: {os: [a, b]}\nsteps: [{run: make}]\n",
		"lint":   "on: push\nsteps: [{run: make}]\n",
		"deploy": "on: push\nneeds: [lint, build]\nsteps: [{run: make}]\n",
	})
	for _, tt := range []struct {
		name     string
		statuses map[string]string
		ok       bool
		why      string
	}{
		{"all succeeded", map[string]string{"lint": "success", "build (os=a)": "success", "build (os=b)": "success"}, true, ""},
		{"a leg failed", map[string]string{"lint": "success", "build (os=a)": "success", "build (os=b)": "failure"}, false, "needs build (os=b), which ended failure"},
		{"skipped by its paths", map[string]string{"lint": "skipped", "build (os=a)": "success", "build (os=b)": "success"}, false, "needs lint, which ended skipped"},
		{"did not run", map[string]string{"build (os=a)": "success", "build (os=b)": "success"}, false, "needs lint, which did not run for this event"},
	} {
		checks := map[string]forge.Check{}
		for name, st := range tt.statuses {
			checks[ev.CheckKey(name)] = forge.Check{Status: st}
		}
		ok, why := needsVerdict(jobs["deploy"], func(key string) (forge.Check, bool) { c, ok := checks[key]; return c, ok })
		if ok != tt.ok || why != tt.why {
			t.Errorf("%s: %v %q, want %v %q", tt.name, ok, why, tt.ok, tt.why)
		}
	}
}

// needsWorld is a world of two workers running build and test (which
// needs build) of one push: build publishes bin/tool; secret.txt, an
// output no artifacts entry names, stays behind. It returns the runs
// each session received, by workflow, and the keys' final checks.
func needsWorld(t *testing.T, buildCode int) (w *world, jobs map[string]*job.Job, received map[string]map[string]string, testStartedAfter string) {
	w = newWorld(t)
	w.cfg.Concurrency = 2
	w.s = New(w.cfg, w.facts, w.ports, nil)
	w.exec.Outputs = map[string]string{"bin/tool": "built", "secret.txt": "x"}
	ev := rig.Push("3k1", "c1")
	repo, _ := w.git.Open(context.Background(), job.MirrorKey(ev))
	jobs = neededJobs(t, ev, repo, buildAndTest)
	buildRun, testRun := run.IDFor(rig.Runner, jobs["build"].Key), run.IDFor(rig.Runner, jobs["test"].Key)
	var mu sync.Mutex
	w.exec.OnStart = func(spec executor.Spec) {
		if spec.RunID == testRun {
			// What build's check says as test's session starts.
			c, _ := w.keeper.Get(jobs["build"].Key)
			mu.Lock()
			testStartedAfter = c.Status
			mu.Unlock()
		}
	}
	w.exec.Script = func(runID, id string) fakeexec.Step {
		if runID == buildRun {
			return fakeexec.Step{Code: buildCode}
		}
		return fakeexec.Step{}
	}
	stop := w.work(t, w.s)
	for _, name := range []string{"build", "test"} {
		if _, err := w.s.Enqueue(t.Context(), jobs[name]); err != nil {
			t.Fatal(err)
		}
	}
	synctest.Wait()
	stop()
	received = map[string]map[string]string{}
	for name, j := range jobs {
		if sess := w.exec.Session(run.IDFor(rig.Runner, j.Key)); sess != nil {
			received[name] = sess.Received()
		}
	}
	return w, jobs, received, testStartedAfter
}

// TestNeedsRunAfterWithArtifacts: test, which needs build, waits
// (queued, saying so) until build's run ended success, then runs with
// build's artifact in its checkout, and only that output.
func TestNeedsRunAfterWithArtifacts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, jobs, received, after := needsWorld(t, 0)
		if diff := cmp.Diff([]string{"running", "success"}, w.statuses(jobs["build"])); diff != "" {
			t.Errorf("build's statuses (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"queued", "running", "success"}, w.statuses(jobs["test"])); diff != "" {
			t.Errorf("test's statuses (-want +got):\n%s", diff)
		}
		if after != "success" {
			t.Errorf("test's session started while build's check was %q", after)
		}
		got := map[string]string{}
		for name, data := range received["test"] {
			if _, rel, ok := strings.Cut(name, "/"+workflow.ArtifactsDir+"/"); ok {
				got[rel] = data
			}
		}
		if diff := cmp.Diff(map[string]string{"build/bin/tool": "built"}, got); diff != "" {
			t.Errorf("artifacts in test's checkout (-want +got):\n%s", diff)
		}
	})
}

// TestNeedsSkipWhenANeedFails: when build fails, test never runs: its
// check ends skipped, naming build.
func TestNeedsSkipWhenANeedFails(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, jobs, received, _ := needsWorld(t, 1)
		if diff := cmp.Diff([]string{"running", "failure"}, w.statuses(jobs["build"])); diff != "" {
			t.Errorf("build's statuses (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"queued", "skipped"}, w.statuses(jobs["test"])); diff != "" {
			t.Errorf("test's statuses (-want +got):\n%s", diff)
		}
		if c := w.pds.Checks()[jobs["test"].Key]; c.Error != "needs build, which ended failure" {
			t.Errorf("test's check says %q", c.Error)
		}
		if _, ok := received["test"]; ok {
			t.Error("test's session started")
		}
		if !w.store.Done(jobs["test"].Event.Key()) {
			t.Error("the event is not done")
		}
	})
}

// TestArtifactsHostilePaths: a kept artifact that is a symbolic link
// out of the outputs or has a path that is not clean is not copied (a
// link to a file in them is copied as that file); a checkout whose tree has .knotless/artifacts
// (a file, or a link out of it) gets the runner's directory in its
// place, and nothing is written out of the checkout.
func TestArtifactsHostilePaths(t *testing.T) {
	t.Parallel()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(out, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(out, "bin/tool"), []byte("built"), 0o755))
	must(os.Symlink(filepath.Join(outside, "secret"), filepath.Join(out, "bin/escape")))
	must(os.Symlink("tool", filepath.Join(out, "bin/alias")))
	kept := t.TempDir()
	for _, name := range []string{"bin/escape", "../x", "/etc/passwd", "bin/./tool"} {
		if err := copyFiles(out, kept, []string{name}, nil); err == nil {
			t.Errorf("copied %s", name)
		}
	}
	must(copyFiles(out, kept, []string{"bin/tool", "bin/alias"}, nil))
	names, err := listKept(kept)
	must(err)
	if alias, _ := os.ReadFile(filepath.Join(kept, "bin/alias")); string(alias) != "built" {
		t.Errorf("the link in the outputs was kept as %q", alias)
	}
	if diff := cmp.Diff([]string{"bin/alias", "bin/tool"}, names); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}

	w := newWorld(t)
	ev := rig.Push("3k1", "c1")
	jobs := neededJobs(t, ev, nil, buildAndTest)
	must(copyFiles(out, mkdir(t, w.s.keptDir(jobs["build"].Key)), []string{"bin/tool"}, nil))
	for name, plant := range map[string]func(checkout string) error{
		"a file": func(c string) error {
			return os.WriteFile(filepath.Join(c, ".knotless/artifacts"), []byte("tree's"), 0o644)
		},
		"a link out": func(c string) error {
			return os.Symlink(outside, filepath.Join(c, ".knotless/artifacts"))
		},
		"a linked parent": func(c string) error {
			must(os.Remove(filepath.Join(c, ".knotless")))
			return os.Symlink(outside, filepath.Join(c, ".knotless"))
		},
	} {
		checkout := t.TempDir()
		must(os.MkdirAll(filepath.Join(checkout, ".knotless"), 0o755))
		must(plant(checkout))
		err := w.s.placeArtifacts(&task{Job: jobs["test"]}, checkout)
		if left, _ := os.ReadDir(outside); len(left) != 1 {
			t.Errorf("%s: written out of the checkout: %v", name, left)
		}
		if name == "a linked parent" {
			if err == nil {
				t.Errorf("%s: placed through a link out of the checkout", name)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		data, err := os.ReadFile(filepath.Join(checkout, ".knotless/artifacts/build/bin/tool"))
		if err != nil || string(data) != "built" {
			t.Errorf("%s: the artifact in the checkout: %q, %v", name, data, err)
		}
	}
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestArtifactsMasked: an artifact handed on is masked as the log and
// the files published are: a run that needs it, granted no secret,
// cannot print one its need was granted.
func TestArtifactsMasked(t *testing.T) {
	t.Parallel()
	out, kept := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "deploy.env"), []byte("TOKEN=s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := copyFiles(out, kept, []string{"deploy.env"}, mask.NewSet([]string{"s3cret"})); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(kept, "deploy.env")); string(got) != "TOKEN=***\n" {
		t.Errorf("kept %q, want the secret masked", got)
	}
}

// TestArtifactsNotKept: a run whose need's artifacts are not kept on
// this runner is told so, not run without them.
func TestArtifactsNotKept(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	jobs := neededJobs(t, rig.Push("3k1", "c1"), nil, buildAndTest)
	err := w.s.placeArtifacts(&task{Job: jobs["test"]}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "the artifacts of build are not kept on this runner") {
		t.Errorf("got %v, want the artifacts of build not kept", err)
	}
}

// TestAdoptedNeededRunKeepsItsArtifacts: a needed run taken over from
// an earlier process is rebuilt as planned, so its artifacts are kept
// for the runs that need it when it ends here.
func TestAdoptedNeededRunKeepsItsArtifacts(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	var wfs []*workflow.Workflow
	for name, src := range buildAndTest {
		wf, err := workflow.Parse(".knotless/workflows/"+name+".yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		wfs = append(wfs, wf)
	}
	w.git.SetWorkflows(wfs...)
	ev := rig.Push("3k1", "c1")
	j := neededJobs(t, ev, nil, buildAndTest)["build"]
	saved, err := job.Encode(j, forge.Check{})
	if err != nil {
		t.Fatal(err)
	}
	rebuilt, err := w.s.rebuild(t.Context(), j.Key, state.Run{RunID: "r1", Workflow: "build", Job: saved}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rebuilt.Workflow.Needed {
		t.Error("the adopted build is not marked needed: its artifacts would not be kept")
	}
}
