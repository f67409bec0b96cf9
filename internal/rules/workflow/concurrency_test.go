package workflow

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestConcurrency: a group alone or with cancel-in-progress; its
// placeholders filled in from the event, the workflow and a leg's
// values.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	w, err := Parse("deploy.yaml", []byte("on: push\nconcurrency: deploy-${{ event.branch }}\nsteps: [{run: x}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w.Concurrency == nil || w.Concurrency.CancelInProgress {
		t.Fatalf("concurrency %+v, want a group without cancel-in-progress", w.Concurrency)
	}
	for ref, want := range map[string]string{"refs/heads/main": "deploy-main", "refs/tags/v1": "deploy-"} {
		if got := w.GroupOf(CondEvent{Kind: "push", Ref: ref}); got != want {
			t.Errorf("group for %s: %q, want %q", ref, got, want)
		}
	}

	src := "on: [push, pull]\nmatrix:\n  os: [linux, mac]\nconcurrency:\n  group: ${{ workflow }}/${{event.kind}}/${{ matrix.os }}/${{ event.base }}\n  cancel-in-progress: true\nsteps: [{run: x}]\n"
	m, err := Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	legs := m.Legs()
	var got []string
	for _, l := range legs {
		if !l.Concurrency.CancelInProgress {
			t.Errorf("leg %s lost cancel-in-progress", l.Name)
		}
		got = append(got, l.GroupOf(CondEvent{Kind: "pull", Ref: "refs/heads/main", Base: "main"}))
	}
	want := []string{"test (os=linux)/pull/linux/main", "test (os=mac)/pull/mac/main"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("legs' groups (-want +got):\n%s", diff)
	}
	if g := (&Workflow{}).GroupOf(CondEvent{}); g != "" {
		t.Errorf("a workflow without concurrency is in group %q", g)
	}
}

// TestConcurrencyErrors: each misuse is an error at its place.
func TestConcurrencyErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ src, want string }{
		{"on: push\nconcurrency: ''\nsteps: [{run: x}]\n", "w.yaml:2:14: concurrency.group: want a group's name, got none"},
		{"on: push\nconcurrency: a-${{ secrets.X }}\nsteps: [{run: x}]\n", "w.yaml:2:14: concurrency.group: ${{ secrets.X }}: want one of event.kind, event.ref, event.branch, event.base, workflow"},
		{"on: push\nconcurrency: a-${{ matrix.os }}\nsteps: [{run: x}]\n", "w.yaml:2:14: concurrency.group: ${{ matrix.os }}: want one of event.kind, event.ref, event.branch, event.base, workflow"},
		{"on: push\nconcurrency: a-${{ event.kind\nsteps: [{run: x}]\n", "w.yaml:2:14: concurrency.group: a ${{ without its }}"},
		{"on: push\nconcurrency: {group: a, cancel-in-progress: yes please}\nsteps: [{run: x}]\n", "concurrency.cancel-in-progress: want true or false"},
		{"on: push\nconcurrency: {cancel-in-progress: true}\nsteps: [{run: x}]\n", `concurrency: missing field "group"`},
		{"on: push\nconcurrency: {group: a, queue: 2}\nsteps: [{run: x}]\n", `concurrency: unknown field "queue"`},
		{"on: push\nconcurrency: " + strings.Repeat("a", 257) + "\nsteps: [{run: x}]\n", "concurrency.group: 257 bytes, more than 256"},
	} {
		_, err := Parse("w.yaml", []byte(tt.src))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want %q", tt.src, err, tt.want)
		}
	}
}
