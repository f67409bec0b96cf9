package mirror

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestWorkflowsShapes: what Workflows reads from the workflow
// directories a repository may have, with one process for the listing
// and every file.
func TestWorkflowsShapes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ok := func(name string) string { return "on: [push]\nsteps:\n  - name: " + name + "\n    run: echo\n" }
	for _, tc := range []struct {
		name    string
		files   map[string]string
		links   map[string]string // a symbolic link at the key, to the value
		want    []string          // the workflows read, by name
		bad     int
		wantErr string
	}{
		{name: "no directory", files: map[string]string{"a.txt": "x"}},
		{name: "the directory is a file", files: map[string]string{".knotless/workflows": "x"}, wantErr: "not a directory"},
		{name: "files among others", files: map[string]string{
			".knotless/workflows/build.yaml":       ok("build"),
			".knotless/workflows/test.yml":         ok("test"),
			".knotless/workflows/notes.txt":        "not a workflow",
			".knotless/workflows/sub.yaml/x.yaml":  ok("nested"),
			".knotless/workflows/name with ü.yaml": ok("unicode"),
			".knotless/other/other.yaml":           ok("other"),
		}, want: []string{"build", "name with ü", "test"}},
		{name: "a link is a file of its target's name",
			files: map[string]string{".knotless/workflows/a.yaml": ok("a"), "secret.yaml": ok("secret")},
			links: map[string]string{".knotless/workflows/link.yaml": "../../secret.yaml"},
			want:  []string{"a"}, bad: 1},
		{name: "a file that does not parse", files: map[string]string{".knotless/workflows/a.yaml": ok("a"), ".knotless/workflows/b.yaml": "on: [nothing]\n"},
			want: []string{"a"}, bad: 1},
		{name: "needs: a cycle and a missing name are files with errors", files: map[string]string{
			".knotless/workflows/a.yaml": ok("a"),
			".knotless/workflows/b.yaml": "on: [push]\nneeds: [c]\nsteps: [{run: x}]\n",
			".knotless/workflows/c.yaml": "on: [push]\nneeds: [b]\nsteps: [{run: x}]\n",
			".knotless/workflows/d.yaml": "on: [push]\nneeds: [gone]\nsteps: [{run: x}]\n",
			".knotless/workflows/e.yaml": "on: [push]\nneeds: [a]\nsteps: [{run: x}]\n",
		}, want: []string{"a", "e"}, bad: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			gitIn(t, dir, "init", "--quiet", "--initial-branch=main")
			for name, target := range tc.links {
				_ = os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
				if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			commit := commitFiles(t, dir, tc.files)
			r := open(t, Options{Policy: Policy{AllowLocal: true}}, "k")
			if err := r.Fetch(ctx, Owner, "file://"+dir, "refs/heads/main", commit); err != nil {
				t.Fatal(err)
			}
			wfs, bad, err := r.Workflows(ctx, commit)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, wf := range wfs {
				names = append(names, wf.Name)
			}
			slices.Sort(names)
			if !slices.Equal(names, tc.want) || len(bad) != tc.bad {
				t.Errorf("read %q and %d bad (%v), want %q and %d bad", names, len(bad), bad, tc.want, tc.bad)
			}
		})
	}
}

// TestWorkflowsOfWhatTheMirrorHasNot: a commit the mirror does not hold
// is an error, not a commit without workflows.
func TestWorkflowsOfWhatTheMirrorHasNot(t *testing.T) {
	t.Parallel()
	r := open(t, Options{}, "k")
	if _, _, err := r.Workflows(context.Background(), strings.Repeat("1", 40)); err == nil {
		t.Error("workflows of a commit the mirror has not: no error")
	}
}

// TestBatchRefusesAnObjectOverItsLimit: an object larger than the
// caller allows is an error, the batch answers nothing after it, and
// closing it does not wait for the git process blocked writing the
// object nobody reads (the git timeout is an hour here).
func TestBatchRefusesAnObjectOverItsLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, commit := source(t, map[string]string{"big.bin": strings.Repeat("x", 4<<20), "small.txt": "x\n"})
	r := open(t, Options{Policy: Policy{AllowLocal: true}, Timeout: time.Hour}, "k")
	if err := r.Fetch(ctx, Owner, "file://"+src, "refs/heads/main", commit); err != nil {
		t.Fatal(err)
	}
	b, err := r.batch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, data, err := b.contents(commit+":small.txt", 10); err != nil || string(data) != "x\n" {
		t.Fatalf("small.txt: %q, %v", data, err)
	}
	if _, _, _, err := b.contents(commit+":big.bin", 1<<20); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("big.bin over the limit: %v, want an error", err)
	}
	if _, _, _, err := b.info(commit + ":small.txt"); err == nil {
		t.Error("the batch answered after an object left unread")
	}
	closed := make(chan struct{})
	go func() {
		b.close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("close waits for the git process blocked on the unread object")
	}
}

// TestParseTreeRefusesMalformed: a tree object cut short or without
// its separators is an error, not entries made up.
func TestParseTreeRefusesMalformed(t *testing.T) {
	t.Parallel()
	id := strings.Repeat("\x01", 20)
	good := "100644 a.yaml\x00" + id + "40000 d\x00" + id
	entries, err := parseTree([]byte(good), 20)
	if err != nil || len(entries) != 2 || entries[0].name != "a.yaml" || !entries[0].blob() || entries[1].blob() ||
		entries[0].id != strings.Repeat("01", 20) {
		t.Fatalf("parse %q: %+v, %v", good, entries, err)
	}
	for _, bad := range []string{good[:len(good)-1], "100644a.yaml\x00" + id, "100644 a.yaml" + id, " a.yaml\x00" + id} {
		if _, err := parseTree([]byte(bad), 20); err == nil {
			t.Errorf("parse %q: no error", bad)
		}
	}
}

// TestGitProcesses: reading a commit's workflows is one git process
// however many files there are, and a mirror's maintenance (git gc
// --auto) runs after its first fetch and its maintainEvery+1-th in the
// process, never inside a fetch. A git wrapper first in PATH logs each
// command and has git trace its children.
func TestGitProcesses(t *testing.T) {
	// The source's commits first, with git as it is (a commit runs
	// maintenance of its own).
	src := t.TempDir()
	gitIn(t, src, "init", "--quiet", "--initial-branch=main")
	files := map[string]string{}
	for i := range 3 {
		files[fmt.Sprintf(".knotless/workflows/w%d.yaml", i)] = fmt.Sprintf("on: [push]\nsteps:\n  - name: s%d\n    run: echo\n", i)
	}
	commit := commitFiles(t, src, files)
	var later []string
	for i := range maintainEvery {
		later = append(later, commitFiles(t, src, map[string]string{"n.txt": fmt.Sprint(i)}))
	}

	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	logFile := filepath.Join(bin, "git.log")
	trace := filepath.Join(bin, "trace")
	wrapper := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\nGIT_TRACE2_EVENT=%s exec %s \"$@\"\n", logFile, trace, real)
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	ctx := context.Background()
	r := open(t, Options{Policy: Policy{AllowLocal: true}}, "k")
	if err := r.Fetch(ctx, Owner, "file://"+src, "refs/heads/main", commit); err != nil {
		t.Fatal(err)
	}
	logged := func() []string {
		b, _ := os.ReadFile(logFile)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	before := len(logged())
	wfs, bad, err := r.Workflows(ctx, commit)
	if err != nil || len(wfs) != 3 || len(bad) != 0 {
		t.Fatalf("workflows: %d, bad %v, %v", len(wfs), bad, err)
	}
	if cmds := logged()[before:]; len(cmds) != 1 {
		t.Errorf("reading 3 workflow files ran %d git commands, want 1: %q", len(cmds), cmds)
	}

	for _, c := range later {
		if err := r.Fetch(ctx, Owner, "file://"+src, "refs/heads/main", c); err != nil {
			t.Fatal(err)
		}
	}
	var maintenance, fetches int
	for _, c := range logged() {
		switch {
		case strings.Contains(c, " maintenance run --auto"):
			maintenance++
		case strings.Contains(c, " fetch "):
			fetches++
			if !strings.Contains(c, "maintenance.auto=false") {
				t.Errorf("a fetch that runs maintenance: %s", c)
			}
		}
	}
	if fetches != maintainEvery+1 || maintenance != 2 {
		t.Errorf("%d fetches ran maintenance %d times, want %d and 2", fetches, maintenance, maintainEvery+1)
	}
	events, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	children := 0
	for line := range strings.SplitSeq(string(events), "\n") {
		if strings.Contains(line, `"event":"child_start"`) {
			children++
			if strings.Contains(line, `"maintenance"`) {
				t.Errorf("git started maintenance itself: %s", line)
			}
		}
	}
	if children == 0 {
		t.Error("the trace shows no child of git: the wrapper did not trace")
	}
}

// TestNewRefusesAnOldGit: a git older than the mirrors need is refused
// at start, naming it and the version needed, not at the first pull it
// cannot merge. A fake git first in PATH answers `git version`.
func TestNewRefusesAnOldGit(t *testing.T) {
	bin := t.TempDir()
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	for _, tc := range []struct {
		says, wantErr string
	}{
		{"git version 2.34.1", "git 2.34.1; knotless-run needs git 2.38 or later"},
		{"git version 1.9.0", "needs git 2.38 or later"},
		{"git version 2.38.0", ""},
		{"git version 2.48.1.windows.1", ""},
		{"git version 3.0.0", ""},
		{"hello", "not a git version"},
	} {
		script := fmt.Sprintf("#!/bin/sh\necho '%s'\n", tc.says)
		if err := os.WriteFile(filepath.Join(bin, "git"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		m, err := New(t.TempDir(), Options{})
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.says, err)
		case tc.wantErr == "" && m.GitVersion() != strings.TrimPrefix(tc.says, "git version "):
			t.Errorf("%q: version %q", tc.says, m.GitVersion())
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), filepath.Join(bin, "git"))):
			t.Errorf("%q: %v, want an error naming %s and saying %q", tc.says, err, filepath.Join(bin, "git"), tc.wantErr)
		}
	}
}
