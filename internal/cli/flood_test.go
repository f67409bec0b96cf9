package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/parts/intake"
)

// TestFloodFlags: serve's flood caps default to 20 workflows an event,
// 20 runs and 200 check writes an hour an author; 0 turns one off; the
// config file takes them by their long names.
func TestFloodFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want intake.Caps
	}{
		{"defaults", nil, intake.Caps{WorkflowsPerEvent: 20, QueuedPerAuthor: 20, CheckWritesPerAuthor: 200}},
		{"set", []string{"--max-workflows-per-event", "5", "--max-queued-per-author", "8", "--max-check-writes-per-author", "90"},
			intake.Caps{WorkflowsPerEvent: 5, QueuedPerAuthor: 8, CheckWritesPerAuthor: 90}},
		{"off", []string{"--max-workflows-per-event", "0", "--max-queued-per-author", "0", "--max-check-writes-per-author", "0"},
			intake.Caps{WorkflowsPerEvent: intake.NoCap, QueuedPerAuthor: intake.NoCap, CheckWritesPerAuthor: intake.NoCap}},
	} {
		root, _, err := parseServe(t, append(append([]string{"serve"}, tc.args...), "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello")...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := root.Serve.caps()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: caps (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestServeRefusesNegativeFloodCaps: a flood cap below 0 stops the
// start, naming the flag.
func TestServeRefusesNegativeFloodCaps(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--max-workflows-per-event", "--max-queued-per-author", "--max-check-writes-per-author"} {
		dir := t.TempDir()
		r := runCLI(t, map[string]string{}, "serve", "--executor", "shell", flag+"=-1",
			"--did", "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "--pds", "http://127.0.0.1:1", "--state-dir", filepath.Join(dir, "state"),
			"--cache-dir", filepath.Join(dir, "cache"), "--shell-root", dir, "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb/hello")
		if want := flag + " -1: want 0 (no cap) or more"; r.code != ExitConfig || !strings.Contains(r.stderr, want) {
			t.Errorf("%s -1: exit %d, want %d and %q\nstderr:\n%s", flag, r.code, ExitConfig, want, r.stderr)
		}
	}
}
