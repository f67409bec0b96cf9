package daemon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
)

// TestServePathFilters: through serve, on the real PDS, a push that
// touches only docs/ writes a skipped check for a workflow with
// paths-ignore: [docs/**] (saying why) and runs the others; a push that
// touches code runs it.
func TestServePathFilters(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.start(w.config())
	files := map[string]string{
		".knotless/workflows/code.yaml": workflowFile(`
on:
  push:
    paths-ignore: ["docs/**"]
steps:
  - run: echo code-ran
`),
		".knotless/workflows/docs.yaml": workflowFile(`
on:
  push:
    paths: ["docs/**/*.md"]
steps:
  - run: echo docs-ran
`),
		"main.go": "package main\n",
	}
	_, first := w.Push(files)
	// What the first push changed is not known (its old commit is not
	// in the mirror, which fetched only the new): both run.
	for _, wf := range []string{"code", "docs"} {
		if _, c := w.waitFinal(wf, first, 90*time.Second); c.Status != "success" {
			t.Fatalf("%s on the first push: %s %s", wf, c.Status, c.Error)
		}
	}
	_, docsOnly := w.Push(map[string]string{"docs/guide/intro.md": "# intro\n"})
	_, c := w.waitFinal("code", docsOnly, 90*time.Second)
	want := "skipped: every file the push changed (1) matches on.push.paths-ignore (docs/**)"
	if c.Status != "skipped" || c.Error != want || len(c.Steps) != 0 || c.Log != nil {
		t.Errorf("code on a push of docs/ only: %s %q, steps %v; want skipped %q", c.Status, c.Error, c.Steps, want)
	}
	if _, d := w.waitFinal("docs", docsOnly, 90*time.Second); d.Status != "success" || !strings.Contains(w.runLog(d), "docs-ran") {
		t.Errorf("docs on a push of docs/: %s %q", d.Status, d.Error)
	}
	if got := w.checkLog.statuses("code", docsOnly); strings.Join(got, " ") != "skipped" {
		t.Errorf("code's check writes on the docs push: %v, want skipped alone", got)
	}
	_, code := w.Push(map[string]string{"main.go": "package main\n\nfunc main() {}\n"})
	if _, c := w.waitFinal("code", code, 90*time.Second); c.Status != "success" {
		t.Errorf("code on a push of main.go: %s %q", c.Status, c.Error)
	}
	if _, d := w.waitFinal("docs", code, 90*time.Second); d.Status != "skipped" {
		t.Errorf("docs on a push of main.go: %s %q, want skipped", d.Status, d.Error)
	}
}

// TestMergeQueueLandsAPullItsPathFiltersSkip: a required pre-flight
// (queue: first) whose paths-ignore leaves out a pull that touches only
// docs/ writes a skipped check, and the queue counts it as passing: the
// pull lands, though the pre-flight's steps would fail had they run.
func TestMergeQueueLandsAPullItsPathFiltersSkip(t *testing.T) {
	t.Parallel()
	m := newMQWorld(t, nil, nil)
	m.pushMain(map[string]string{".knotless/workflows/pre.yaml": workflowFile(`
on:
  pull:
    paths-ignore: ["docs/**"]
queue: first
steps:
  - run: 'false'
`)})
	base := m.head()
	p, c := m.pull("docs", "", map[string]string{"docs/a.md": "a\n"})
	m.enqueue(p, c)
	m.start(m.config())
	m.waitFor("landing", 2*time.Minute, func() bool {
		return len(list[forge.Landing](m, m.Runner.DID, forge.CollectionLanding)) > 0
	})
	if _, pre := m.waitFinal("pre", c, time.Minute); pre.Status != "skipped" {
		t.Errorf("pre-flight of a docs-only pull: %s %q, want skipped", pre.Status, pre.Error)
	}
	if diff := cmp.Diff([]string{"docs"}, m.subjects(base)); diff != "" {
		t.Errorf("main's new commits (-want +got):\n%s", diff)
	}
	if ej := m.ejections(m.Runner.DID); len(ej) != 0 {
		t.Errorf("ejections: %+v", ej)
	}
}
