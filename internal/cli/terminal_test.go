package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/forgeworld"
)

// osc52 sets the terminal's clipboard (to "rm -rf ~").
const osc52 = "\x1b]52;c;cm0gLXJmIH4K\x07"

// ttyBuffer is a stdout that says it is a terminal.
type ttyBuffer struct{ bytes.Buffer }

func (*ttyBuffer) Terminal() bool { return true }

// runTTY is runCLI with stdout a terminal.
func runTTY(t *testing.T, args ...string) result {
	t.Helper()
	var stdout ttyBuffer
	var stderr bytes.Buffer
	code := Main(context.Background(), args, Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }})
	return result{code, stdout.String(), stderr.String()}
}

// sgr matches the colour sequences a log may keep on a terminal.
var sgr = regexp.MustCompile("\x1b\\[[0-9;]*m")

// TestLogsOnATerminal: a log's escape sequences other than colours
// (OSC 52, clearing the screen) and a carriage return alone do not
// reach a terminal, with or without --follow, also split across chunks;
// to a pipe the bytes are written as they are.
func TestLogsOnATerminal(t *testing.T) {
	t.Parallel()
	hub, url := outputServer(t)
	log := "\x1b[31mred\x1b[0m " + osc52 + "\x1b[2J\x1b[Hclear\x1b[?1049h\r\nprogress 10%\rdone\x07\n"
	shown := "\x1b[31mred\x1b[0m clear\nprogress 10%\ndone\n"
	s, _ := hub.Open(logsCheck, "r")
	_, _ = s.Write([]byte(log))

	r := runTTY(t, "logs", "--from", url, logsCheck)
	if r.code != ExitSuccess || r.stdout != shown {
		t.Errorf("logs on a terminal: exit %d, stdout %q, want %q; stderr %q", r.code, r.stdout, shown, r.stderr)
	}
	if rest := sgr.ReplaceAllString(r.stdout, ""); strings.ContainsAny(rest, "\x1b\x07\r") {
		t.Errorf("logs on a terminal prints a control other than a colour: %q", r.stdout)
	}
	if r := runCLI(t, nil, "logs", "--from", url, logsCheck); r.code != ExitSuccess || r.stdout != log {
		t.Errorf("logs to a pipe: exit %d, stdout %q, want the bytes as they are %q", r.code, r.stdout, log)
	}

	// Followed, with a sequence split across two chunks.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for s.Watchers() == 0 {
			time.Sleep(time.Millisecond) // until logs -f follows
		}
		_, _ = s.Write([]byte("next \x1b]52;c;"))
		time.Sleep(10 * time.Millisecond)
		_, _ = s.Write([]byte("QQ==\x07line\n"))
		s.End("success")
	}()
	r = runTTY(t, "logs", "--follow", "--from", url, logsCheck)
	wg.Wait()
	if want := shown + "next line\n"; r.code != ExitSuccess || r.stdout != want {
		t.Errorf("logs --follow on a terminal: exit %d, stdout %q, want %q; stderr %q", r.code, r.stdout, want, r.stderr)
	}
}

// TestErrorsAreEscaped: the one printer of errors shows what strangers
// wrote in them escaped, its own lines kept.
func TestErrorsAreEscaped(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	err := errors.Join(errors.New("workflow "+osc52+"\x1b[2J: bad"), errors.New("second\u202e line"))
	if code := exitCode(&stderr, err); code != ExitError {
		t.Errorf("exit %d", code)
	}
	want := `knotless-run: workflow \x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J: bad` + "\n" + `second\u202e line` + "\n"
	if stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}

	// From a command: a workflow file, a stranger's, named with OSC 52.
	dir := t.TempDir()
	b, err := os.ReadFile("testdata/control/deploy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "deploy"+osc52+".yaml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "dispatch", "--repo", repoA, "--ref", "main", "--workflow", "deploy", "--workflow-file", file)
	if r.code != ExitConfig || strings.ContainsAny(r.stderr, "\x1b\x07") || !strings.Contains(r.stderr, `is workflow deploy\x1b]52;c;`) {
		t.Errorf("dispatch with a mismatched workflow file: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestRecordsAreEscaped: a record that names a workflow from a
// stranger's file shows its bidi and C1 controls as JSON escapes: the
// same record.
func TestRecordsAreEscaped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, err := os.ReadFile("testdata/control/deploy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	name := "dep\u202eyol\u009b"
	file := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "dispatch", "--print", "--repo", repoA, "--ref", "main", "--workflow-file", file, "--input", "note=hi", "--input", "target=production")
	if r.code != ExitSuccess {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if strings.ContainsAny(r.stdout, "\u202e\u009b") || !strings.Contains(r.stdout, `dep\u202eyol\u009b`) {
		t.Errorf("the record shows the controls raw:\n%q", r.stdout)
	}
	var got forge.Dispatch
	decodeRecord(t, forge.CollectionDispatch, r.stdout, &got)
	if got.Workflow != name {
		t.Errorf("workflow %q, want %q", got.Workflow, name)
	}
}

// TestValidateEscapes: validate names a stranger's workflow file as
// it is named, escaped.
func TestValidateEscapes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "ci"+osc52+".yaml")
	if err := os.WriteFile(file, []byte("on: [push]\nsteps: nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "validate", file)
	if r.code != ExitFailure || strings.ContainsAny(r.stdout+r.stderr, "\x1b\x07") || !strings.Contains(r.stdout, `ci\x1b]52;c;`) {
		t.Errorf("validate: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// narrowTTY is a stdout that says it is a terminal of width columns.
type narrowTTY struct {
	ttyBuffer
	width int
}

func (n *narrowTTY) Width() int { return n.width }

// TestRunsFitsTheTerminal: runs on a narrow terminal cuts its widest
// columns with "…" to the terminal's width (the key whole) and colours
// the status; with NO_COLOR set, or to a pipe, it prints no escape
// sequence, and to a pipe nothing is cut.
func TestRunsFitsTheTerminal(t *testing.T) {
	t.Parallel()
	srv, w := startWorld(t)
	ctx := context.Background()
	wf := "deploy-the-whole-fleet-to-every-region-one-after-another"
	subject := forge.Subject{Repo: w.RepoURI.String(), Commit: strings.Repeat("a", 40), Ref: "refs/heads/main",
		Event: "at://" + w.Owner.DID.String() + "/dev.knotless.refUpdate/3n3pa7x34wk22", Kind: forge.KindPush}
	key := forge.CheckKey(subject, wf)
	w.Put(w.Runner, forge.CollectionCheck, key, forge.Check{Type: forge.CollectionCheck, Subject: subject,
		Workflow: wf, Status: forge.StatusQueued, CreatedAt: forge.Now()})
	runs := func(stdout io.Writer, noColor string) result {
		var stderr bytes.Buffer
		code := Main(ctx, []string{"runs", "--plc-url", srv.PLCURL, "--repo", w.Owner.DID.String() + "/" + forgeworld.RepoName}, Env{
			Stdin: strings.NewReader(""), Stdout: stdout, Stderr: &stderr,
			Getenv: func(k string) string {
				if k == "NO_COLOR" {
					return noColor
				}
				return ""
			}})
		return result{code: code, stdout: fmt.Sprint(stdout), stderr: stderr.String()}
	}

	const width = 80
	tty := &narrowTTY{width: width}
	r := runs(tty, "")
	if r.code != ExitSuccess || !strings.Contains(r.stdout, key) || !strings.Contains(r.stdout, "…") || !strings.Contains(r.stdout, "\x1b[33mqueued\x1b[0m") {
		t.Fatalf("runs on a terminal of %d columns: exit %d, stdout:\n%s\nstderr:\n%s", width, r.code, r.stdout, r.stderr)
	}
	for _, line := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
		if n := utf8.RuneCountInString(sgr.ReplaceAllString(line, "")); n > width {
			t.Errorf("a line of %d columns on a terminal of %d: %q", n, width, line)
		}
	}

	r = runs(&narrowTTY{width: width}, "1")
	if r.code != ExitSuccess || strings.Contains(r.stdout, "\x1b") || !strings.Contains(r.stdout, "…") {
		t.Errorf("runs on a terminal with NO_COLOR set: exit %d, stdout %q", r.code, r.stdout)
	}
	r = runs(&bytes.Buffer{}, "")
	if r.code != ExitSuccess || strings.Contains(r.stdout, "\x1b") || strings.Contains(r.stdout, "…") || !strings.Contains(r.stdout, wf) {
		t.Errorf("runs to a pipe: exit %d, stdout %q", r.code, r.stdout)
	}
}
