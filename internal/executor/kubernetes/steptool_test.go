package kubernetes

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"knotless.dev/run/internal/engine/payload"
)

// TestStepToolShells runs the step tool under each sh an image may have:
// the test cluster's image has only busybox, and Debian-based images run
// it under dash. Each shell runs in a PID namespace of its own, because
// the tool kills every process that was not alive before the step.
func TestStepToolShells(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED under -short: needs unshare, dash, bash and busybox from the host (the full suite runs it)")
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root for a PID namespace (unshare); CI runs as root")
	}
	secret := "it's \"quoted\" $HOME `id`\nsecond line \\ end '"
	text, err := payload.Build(payload.Step{
		Secrets: []payload.Var{{Name: "TOKEN", Value: secret}},
		Dir:     "/",
		Script:  "STEPFILE",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, shell := range [][]string{{"dash"}, {"bash"}, {"busybox", "sh"}} {
		t.Run(shell[0], func(t *testing.T) {
			if _, err := exec.LookPath(shell[0]); err != nil {
				t.Fatalf("%s is not installed: %v", shell[0], err)
			}
			root := filepath.Join(t.TempDir(), "steps")
			step := filepath.Join(t.TempDir(), "step")
			// It prints the secret, leaves a process behind, reads its
			// stdin (which must be empty) and ends with its own code.
			script := "printf '%s' \"$TOKEN\"\nsh -c 'sleep 300; :' knotless-leftover &\ncat\necho \" read stdin\"\nexit 7\n"
			if err := os.WriteFile(step, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			input := string(launchInput([]byte(strings.Replace(text, "STEPFILE", step, 1)))) + "ok\n"
			// The namespace's init runs the tool, then looks for what is
			// left: a process other than itself, or a file of the step.
			// It holds the wake pipe on its fd 3 as the pod's PID 1 does
			// (keepAlive), so the shells whose read has a -t use it.
			check := `f=$STEP_ROOT.wake; mkfifo "$f" && exec 3<>"$f" && rm "$f" || exit 1
"$@" < "$STEP_INPUT"; echo "tool exit $?"
for p in /proc/[0-9]*; do [ "${p#/proc/}" = $$ ] || echo "left: $(tr '\0' ' ' < $p/cmdline)"; done
ls -A "$STEP_ROOT"; cat "$STEP_ROOT/ledger"`
			args := append([]string{"--pid", "--fork", "--mount-proc", "sh", "-c", check, "check"}, shell...)
			args = append(args, "-c", stepScript, "knotless-step", "start", root, "1")
			in := filepath.Join(t.TempDir(), "input")
			if err := os.WriteFile(in, []byte(input), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("unshare", args...)
			cmd.Env = append(os.Environ(), "STEP_INPUT="+in, "STEP_ROOT="+root)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("unshare: %v\n%s", err, stderr.String())
			}
			want := secret + " read stdin\n"
			// Of the step's files only the ledger is left: its start and
			// its exit code.
			if got := stdout.String(); got != want+"tool exit 0\nledger\nstart 1\nexit 1 7\n" {
				t.Errorf("stdout %q, want %q then the tool's exit and nothing left but the ledger of the step", got, want)
			}
			wantCtl := "knotless: started\nknotless: exit 7 " + strconv.Itoa(len(want)) + "\n"
			if stderr.String() != wantCtl {
				t.Errorf("control lines %q, want %q", stderr.String(), wantCtl)
			}
		})
	}
}

// TestStepToolSuperseded: a shell streaming a step whose exec was let go
// (a stopping runner released it) goes on in the pod; once another shell
// follows the step (the adopting process), the first one leaves without
// a word when the step ends. Before issue 35 it finished as if it still
// streamed: it killed the new follower as a leftover of the step (the
// adopting runner logged "step stream dropped; reattaching"), and could
// have killed a step started after it.
func TestStepToolSuperseded(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED under -short: needs unshare, dash, bash and busybox from the host (the full suite runs it)")
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root for a PID namespace (unshare); CI runs as root")
	}
	for _, shell := range [][]string{{"dash"}, {"bash"}, {"busybox", "sh"}} {
		t.Run(shell[0], func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "steps")
			gate := filepath.Join(dir, "go")
			// The step waits for the test's word, so that it ends while
			// the second shell follows it.
			launch := launchInput([]byte("echo before\nwhile [ ! -e " + gate + " ]; do sleep 0.05; done\necho after\n"))
			if err := os.WriteFile(filepath.Join(dir, "launch"), launch, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "ack"), []byte("ok\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			// The first shell starts the step and never hears back (its
			// stdin ends: the runner let go); the second follows it from
			// its first byte and acknowledges.
			// PID 1 holds the wake pipe on its fd 3 as the pod's does
			// (keepAlive). Without it, fd 3 of this shell is whatever it
			// opened last (a command substitution's pipe), and a step
			// tool that takes it for the wake pipe holds that pipe open.
			script := `cd "$DIR"
f=$DIR/.wake; mkfifo "$f" && exec 3<>"$f" && rm "$f" || exit 1
"$@" start "$DIR/steps" 1 < launch > out1 2> ctl1 &
first=$!
until grep -q started ctl1 2>/dev/null; do sleep 0.05; done
"$@" follow "$DIR/steps" 1 0 < ack > out2 2> ctl2 &
second=$!
until [ -e steps/1.watcher ] && [ "$(cat steps/1.watcher)" = "$second" ]; do sleep 0.05; done
touch "$GATE"
wait $first; echo "first exit $?"
wait $second; echo "second exit $?"`
			args := append([]string{"--pid", "--fork", "--mount-proc", "sh", "-c", script, "check"}, shell...)
			args = append(args, "-c", stepScript, "knotless-step")
			cmd := exec.Command("unshare", args...)
			cmd.Env = append(os.Environ(), "DIR="+dir, "GATE="+gate)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("unshare: %v\n%s", err, out)
			}
			read := func(name string) string {
				b, _ := os.ReadFile(filepath.Join(dir, name))
				return string(b)
			}
			if got := string(out); got != "first exit 0\nsecond exit 0\n" {
				t.Errorf("exits: %q", got)
			}
			if got := read("ctl1"); got != "knotless: started\n" {
				t.Errorf("the released shell's control lines %q, want it started and gone without an exit line", got)
			}
			if got, want := read("ctl2"), "knotless: exit 0 "+strconv.Itoa(len("before\nafter\n"))+"\n"; got != want {
				t.Errorf("the follower's control lines %q, want %q", got, want)
			}
			if got := read("out2"); got != "before\nafter\n" {
				t.Errorf("the follower's output %q, want the whole step's", got)
			}
			left, _ := os.ReadDir(root)
			if len(left) != 1 || left[0].Name() != "ledger" {
				t.Errorf("the step's files are left: %d", len(left))
			}
			if got := read("steps/ledger"); got != "start 1\nexit 1 0\n" {
				t.Errorf("the ledger %q, want the step started once and its exit", got)
			}
		})
	}
}

// TestStepToolOutputsEmpty: the exit line says outputs-empty when the
// outputs directory is a directory with no entry once the step ended,
// and only then (the session then gets the outputs without an exec).
func TestStepToolOutputsEmpty(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED under -short: needs unshare, dash, bash and busybox from the host (the full suite runs it)")
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root for a PID namespace (unshare); CI runs as root")
	}
	cases := []struct {
		name  string
		setup string // shell, with $OUT the outputs directory
		step  string
		empty bool
	}{
		{"empty", `mkdir "$OUT"`, "echo hi", true},
		{"the step writes a file", `mkdir "$OUT"`, `echo image > "$OUT/image.tar"`, false},
		{"a dot file", `mkdir "$OUT" && touch "$OUT/.hidden"`, "true", false},
		{"a dot-dot file", `mkdir "$OUT" && touch "$OUT/..odd"`, "true", false},
		{"a dangling link", `mkdir "$OUT" && ln -s /nowhere "$OUT/link"`, "true", false},
		{"an empty subdirectory", `mkdir -p "$OUT/sub"`, "true", false},
		{"a link to an empty directory", `mkdir "$OUT.real" && ln -s "$OUT.real" "$OUT"`, "true", false},
		{"no directory", `:`, "true", false},
		{"a file", `touch "$OUT"`, "true", false},
	}
	for _, shell := range [][]string{{"dash"}, {"bash"}, {"busybox", "sh"}} {
		t.Run(shell[0], func(t *testing.T) {
			if _, err := exec.LookPath(shell[0]); err != nil {
				t.Fatalf("%s is not installed: %v", shell[0], err)
			}
			for _, c := range cases {
				dir := t.TempDir()
				out := filepath.Join(dir, "outputs")
				input := filepath.Join(dir, "input")
				if err := os.WriteFile(input, append(launchInput([]byte(c.step+"\n")), "ok\n"...), 0o600); err != nil {
					t.Fatal(err)
				}
				script := `set -e; ` + c.setup + `
f=$DIR/.wake; mkfifo "$f" && exec 3<>"$f" && rm "$f"
"$@" start "$DIR/steps" 1 0 "$OUT" < "$DIR/input" > /dev/null`
				args := append([]string{"--pid", "--fork", "--mount-proc", "sh", "-c", script, "check"}, shell...)
				args = append(args, "-c", stepScript, "knotless-step")
				cmd := exec.Command("unshare", args...)
				cmd.Env = append(os.Environ(), "DIR="+dir, "OUT="+out)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Run(); err != nil {
					t.Fatalf("%s: unshare: %v\n%s", c.name, err, stderr.String())
				}
				exit := ""
				for _, line := range strings.Split(stderr.String(), "\n") {
					if strings.HasPrefix(line, "knotless: exit ") {
						exit = line
					}
				}
				if exit == "" {
					t.Fatalf("%s: no exit line in %q", c.name, stderr.String())
				}
				if got := strings.HasSuffix(exit, " outputs-empty"); got != c.empty {
					t.Errorf("%s: exit line %q, want outputs-empty %v", c.name, exit, c.empty)
				}
			}
		})
	}
}
