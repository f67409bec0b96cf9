package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeShellRefusesUntrusted: serve --executor shell with --pulls or
// --discover (strangers' code on the host, beside the sealing key, the
// PDS session and the kubeconfig) stops at start with an error naming
// the flags, before it touches the state directory; with
// --unsafe-shell-untrusted it goes on (here to a login that cannot
// succeed) after a loud warning.
func TestServeShellRefusesUntrusted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		args    []string
		refused string // the flags the refusal names; "" when not refused
		unsafe  bool
	}{
		{name: "pulls", args: []string{"--pulls"}, refused: "--executor shell with --pulls would run strangers' code"},
		{name: "discover", args: []string{"--discover"}, refused: "--executor shell with --discover would run strangers' code"},
		{name: "both", args: []string{"--pulls", "--discover"}, refused: "--executor shell with --pulls and --discover would"},
		{name: "queue", args: []string{"--queue"}, refused: "--executor shell with --queue would run strangers' code"},
		{name: "pulls from the config file", args: []string{"--config", "pulls.json"}, refused: "--executor shell with --pulls would"},
		{name: "override", args: []string{"--pulls", "--unsafe-shell-untrusted"}, unsafe: true},
		{name: "own pushes only", args: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "pulls.json"), []byte(`{"pulls": true}`), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"serve", "--executor", "shell", "--did", freshRunner(),
				"--pds", "http://127.0.0.1:1", "--state-dir", filepath.Join(dir, "state"), "--cache-dir", filepath.Join(dir, "cache"),
				"--shell-root", dir, "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb/hello"}
			for _, a := range tc.args {
				if a == "pulls.json" {
					a = filepath.Join(dir, a)
				}
				args = append(args, a)
			}
			r := runCLI(t, map[string]string{}, args...)
			// A refusal is of the flags (ExitConfig); else it cannot log
			// in, if nothing else.
			want := ExitError
			if tc.refused != "" {
				want = ExitConfig
			}
			if r.code != want {
				t.Fatalf("exit %d, want %d\nstderr:\n%s", r.code, want, r.stderr)
			}
			refused := strings.Contains(r.stderr, "pass --unsafe-shell-untrusted")
			switch {
			case tc.refused != "" && (!refused || !strings.Contains(r.stderr, tc.refused)):
				t.Errorf("want the start refused naming the flags (%q)\nstderr:\n%s", tc.refused, r.stderr)
			case tc.refused != "":
				if _, err := os.Stat(filepath.Join(dir, "state")); err == nil {
					t.Errorf("the refused start made its state directory")
				}
			case refused:
				t.Errorf("refused, want it to go on\nstderr:\n%s", r.stderr)
			}
			warned := strings.Contains(r.stderr, "level=warn") && strings.Contains(r.stderr, "UNSAFE: --unsafe-shell-untrusted")
			if warned != tc.unsafe {
				t.Errorf("warning at start: %v, want %v\nstderr:\n%s", warned, tc.unsafe, r.stderr)
			}
		})
	}
}

// TestRunMaximums: `run` applies the maximums to its run although it is
// trusted, and says which limit the workflow exceeds.
func TestRunMaximums(t *testing.T) {
	t.Parallel()
	dir, runs := t.TempDir(), t.TempDir()
	wf := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(wf, []byte("on: [push]\ntimeout: 6h\nimage: evil.example/miner\nsteps:\n  - name: hi\n    run: echo hi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flags []string
		want  string
		code  int
	}{
		// A workflow past a maximum is a run that ends error; a
		// maximum that is no quantity is a command line that cannot work.
		{[]string{"--max-timeout", "1h"}, "error: timeout 6h0m0s exceeds --max-timeout 1h0m0s", ExitError},
		{[]string{"--allow-image", "registry.example/*", "--allow-image", "busybox:*"}, "error: image evil.example/miner is not allowed by --allow-image registry.example/*, busybox:*", ExitError},
		{[]string{"--max-cpu", "lots"}, "--max-cpu: quantity \"lots\"", ExitConfig},
		{nil, "workflow big: success", ExitSuccess},
	} {
		args := append([]string{"run", "--executor", "shell", "--shell-root", runs, "--workflow", wf, "--workdir", dir}, tc.flags...)
		r := runCLI(t, nil, args...)
		if !strings.Contains(r.stdout+r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want %q\nstdout:\n%s\nstderr:\n%s", tc.flags, r.code, tc.want, r.stdout, r.stderr)
		}
		if r.code != tc.code {
			t.Errorf("%v: exit %d, want %d", tc.flags, r.code, tc.code)
		}
	}
}

// TestServeRefusesEmptyQueueBatch: --queue with --queue-batch below 1
// stops at start, naming the flag.
func TestServeRefusesEmptyQueueBatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runCLI(t, map[string]string{}, "serve", "--executor", "shell", "--unsafe-shell-untrusted", "--queue", "--queue-batch", "0",
		"--did", "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "--pds", "http://127.0.0.1:1", "--state-dir", filepath.Join(dir, "state"),
		"--cache-dir", filepath.Join(dir, "cache"), "--shell-root", dir, "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb/hello")
	if r.code != ExitConfig || !strings.Contains(r.stderr, "--queue-batch 0: want 1 or more") {
		t.Errorf("exit %d, want %d and the flag named\nstderr:\n%s", r.code, ExitConfig, r.stderr)
	}
}
