package daemon

import (
	"slices"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/workflow"
)

// TestRunsFor: a pre-flight runs the queue: first workflows whatever
// their on, a batch the on: batch ones on its base branch, pulls and
// pushes their own.
func TestRunsFor(t *testing.T) {
	t.Parallel()
	parse := func(name, src string) *workflow.Workflow {
		wf, err := workflow.Parse(".knotless/workflows/"+name+".yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return wf
	}
	pre := parse("pre", "on: push\nqueue: first\nsteps:\n  - run: x\n")
	batch := parse("batch", "on: batch\nbranches: [main]\nsteps:\n  - run: x\n")
	pull := parse("pull", "on: pull\nsteps:\n  - run: x\n")
	push := parse("push", "on: push\nsteps:\n  - run: x\n")
	uri := syntax.ATURI("at://did:plc:x/dev.knotless.pull/3n3pa7x34wk22")
	for _, c := range []struct {
		name string
		ev   ingest.Event
		want []string
	}{
		{"pre-flight", ingest.Event{Kind: forge.KindPull, URI: uri, Ref: "refs/heads/main", Preflight: true}, []string{"pre"}},
		{"pull", ingest.Event{Kind: forge.KindPull, URI: uri, Ref: "refs/heads/main"}, []string{"pull"}},
		{"batch on main", ingest.Event{Kind: forge.KindBatch, Ref: "refs/heads/main"}, []string{"batch"}},
		{"batch on dev", ingest.Event{Kind: forge.KindBatch, Ref: "refs/heads/dev"}, nil},
		{"push", ingest.Event{Kind: forge.KindPush, Ref: "refs/heads/main"}, []string{"pre", "push"}},
	} {
		var got []string
		for _, wf := range []*workflow.Workflow{pre, batch, pull, push} {
			if runsFor(wf, c.ev) {
				got = append(got, wf.Name)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: runs %v, want %v", c.name, got, c.want)
		}
	}
	a := ingest.Event{Kind: forge.KindPull, URI: uri, Commit: "c"}
	b := a
	b.Preflight = true
	if a.Key() == b.Key() || forge.CheckKey(a.Subject(), "pre") != forge.CheckKey(b.Subject(), "pre") {
		t.Error("a pre-flight must be work apart from its pull (its own event key) yet share the pull's check of a workflow")
	}
}
