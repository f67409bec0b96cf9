package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/parts/lander"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/parts/scheduler"
)

// warmer is an executor that keeps warm sessions, as far as Validate
// can tell.
type warmer struct{ *fakeexec.Executor }

func (warmer) KeepWarm(context.Context, int) {}

// TestValidate: every rule between settings, each refusal naming the
// flags (or the secret) involved.
func TestValidate(t *testing.T) {
	t.Parallel()
	repo := []ingest.Target{{Owner: "did:plc:owner", Name: "hello"}}
	sh := shell.New(shell.Config{Root: t.TempDir()})
	scoped := scheduler.OperatorSecret{Name: "SCOPED", Repos: []string{"at://did:plc:owner/dev.knotless.repo/hello"}}
	wide := scheduler.OperatorSecret{Name: "WIDE", Repos: []string{scheduler.AnyRepo}}
	for _, tc := range []struct {
		name    string
		cfg     Config
		refused string // "" when valid
	}{
		{"a repository", Config{Sources: Sources{Targets: repo}}, ""},
		{"discovery", Config{Sources: Sources{Discover: true}}, ""},
		{"nothing to serve", Config{}, "no repositories: name some (OWNER/NAME) or pass --discover"},
		{"shell with pulls", Config{Sources: Sources{Targets: repo, Pulls: true}, Engine: run.Config{Executor: sh}},
			"--executor shell with --pulls would run strangers' code"},
		{"shell with everything", Config{Sources: Sources{Discover: true, Pulls: true}, Lander: lander.Config{Queue: true, Batch: 1},
			Engine: run.Config{Executor: sh}}, "--executor shell with --pulls and --queue and --discover would"},
		{"shell with pulls, unsafe", Config{Sources: Sources{Targets: repo, Pulls: true}, Engine: run.Config{Executor: sh},
			UnsafeShellUntrusted: true}, ""},
		{"shell with pushes", Config{Sources: Sources{Targets: repo}, Engine: run.Config{Executor: sh}}, ""},
		{"another executor with pulls", Config{Sources: Sources{Targets: repo, Pulls: true}, Engine: run.Config{Executor: &fakeexec.Executor{}}}, ""},
		{"an empty batch", Config{Sources: Sources{Targets: repo}, Lander: lander.Config{Queue: true}}, "--queue-batch 0: want 1 or more"},
		{"an empty batch without the queue", Config{Sources: Sources{Targets: repo}}, ""},
		{"a secret for no repository", Config{Sources: Sources{Targets: repo}, Scheduler: scheduler.Config{Secrets: []scheduler.OperatorSecret{{Name: "NONE"}}}},
			"secret NONE names no repository"},
		{"an unscoped secret", Config{Sources: Sources{Targets: repo}, Scheduler: scheduler.Config{Secrets: []scheduler.OperatorSecret{scoped, wide}}}, ""},
		{"an unscoped secret with discovery", Config{Sources: Sources{Discover: true}, Scheduler: scheduler.Config{Secrets: []scheduler.OperatorSecret{scoped, wide}}},
			"secret WIDE is for every repository"},
		{"scoped secrets with discovery", Config{Sources: Sources{Discover: true}, Scheduler: scheduler.Config{Secrets: []scheduler.OperatorSecret{scoped}}}, ""},
		{"an output service without its DID", Config{Sources: Sources{Targets: repo}, Live: live.Config{Service: "https://out.example"}}, "--output-service-did"},
		{"a listener on every address", Config{Sources: Sources{Targets: repo}, Live: live.Config{Listen: ":8788"}}, "set --public-url"},
		{"warm pods on shell", Config{Sources: Sources{Targets: repo}, Engine: run.Config{Executor: sh}, WarmPods: 1},
			"--warm-pods 1: only --executor kubernetes keeps warm pods"},
		{"warm pods on an executor that keeps them", Config{Sources: Sources{Targets: repo}, Engine: run.Config{Executor: warmer{&fakeexec.Executor{}}}, WarmPods: 2}, ""},
		{"no warm pods on shell", Config{Sources: Sources{Targets: repo}, Engine: run.Config{Executor: sh}}, ""},
		{"fewer than no warm pods", Config{Sources: Sources{Targets: repo}, Engine: run.Config{Executor: warmer{&fakeexec.Executor{}}}, WarmPods: -1},
			"--warm-pods -1: want 0 or more"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%s: %v, want valid", tc.name, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%s: %v, want refused with %q", tc.name, err, tc.refused)
		}
	}
	var se *SecretError
	err := (&Config{Sources: Sources{Discover: true}, Scheduler: scheduler.Config{Secrets: []scheduler.OperatorSecret{wide}}}).Validate()
	if !errors.As(err, &se) || se.Name != "WIDE" {
		t.Errorf("a refused secret: %v, want a SecretError naming it", err)
	}
	unsafe := Config{Sources: Sources{Targets: repo, Pulls: true}, Engine: run.Config{Executor: sh}, UnsafeShellUntrusted: true}
	if got := unsafe.UnsafeShell(); got != "--pulls" {
		t.Errorf("UnsafeShell = %q, want --pulls", got)
	}
	unsafe.Sources.Pulls = false
	if got := unsafe.UnsafeShell(); got != "" {
		t.Errorf("UnsafeShell with no strangers' work = %q", got)
	}
}
