package scheduler

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/workflow"
)

// legJobs are the legs of the 3×2 matrix "test" less one, of one push,
// with max-parallel n and fail-fast ff.
func legJobs(t *testing.T, n int, ff bool) []*job.Job {
	t.Helper()
	src := "on: push\nmatrix:\n  a: [x, y, z]\n  b: [p, q]\n  exclude: [{a: z, b: q}]\n  fail-fast: " + map[bool]string{true: "true", false: "false"}[ff] + "\n"
	if n > 0 {
		src += "  max-parallel: " + string(rune('0'+n)) + "\n"
	}
	wf, err := workflow.Parse("test.yaml", []byte(src+"steps: [{run: x}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	var jobs []*job.Job
	for _, leg := range wf.Legs() {
		j := pushJob("3k1", "main", "x")
		j.Workflow, j.Key = leg, leg.Name
		jobs = append(jobs, j)
	}
	return jobs
}

func TestMaxParallelHoldsLegs(t *testing.T) {
	t.Parallel()
	q := newQueue()
	jobs := legJobs(t, 2, false)
	other := pushJob("3k1", "main", "lint")
	for _, j := range jobs {
		q.add(one(j))
	}
	q.add(one(other))
	var claimed []string
	for t := q.claim(); t != nil; t = q.claim() {
		claimed = append(claimed, t.Key)
	}
	want := []string{"test (a=x, b=p)", "test (a=x, b=q)", "k-3k1-lint"}
	if diff := cmp.Diff(want, claimed); diff != "" {
		t.Errorf("claimed with two legs running (-want +got):\n%s", diff)
	}
	// A leg ends: one more may go.
	q.end(q.running["test (a=x, b=p)"])
	if got := q.claim(); got == nil || got.Key != "test (a=y, b=p)" {
		t.Errorf("after a leg ended, claimed %v, want the next leg", got)
	}
	if got := q.claim(); got != nil {
		t.Errorf("claimed %s past max-parallel", got.Key)
	}
	// A leg that comes while two run is not promised a worker.
	if !q.legsFull(jobs[4]) {
		t.Error("legsFull: false with two legs running")
	}
}

func TestFailFastTakesOutTheOtherLegs(t *testing.T) {
	t.Parallel()
	q := newQueue()
	jobs := legJobs(t, 0, true)
	for _, j := range jobs {
		q.add(one(j))
	}
	other := pushJob("3k1", "main", "lint")
	q.add(one(other))
	a, b := q.claim(), q.claim()
	dropped, cancel := q.failFast(a, "the failed leg")
	if diff := cmp.Diff([]string{"test (a=y, b=p)", "test (a=y, b=q)", "test (a=z, b=p)"}, keys(dropped)); diff != "" {
		t.Errorf("dropped (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{b.Key}, keys(cancel)); diff != "" || b.superseded != "the failed leg" {
		t.Errorf("cancel (-want +got):\n%s; superseded %q", diff, b.superseded)
	}
	if diff := cmp.Diff([]string{"k-3k1-lint"}, keys(q.waiting)); diff != "" {
		t.Errorf("waiting (-want +got):\n%s", diff)
	}
}
