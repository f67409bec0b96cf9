package cli

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/lib/tarstream"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/parts/intake"
	"knotless.dev/run/internal/parts/lander"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/internal/rules/class"
)

// TestServeConfig: each flag's place in the daemon's config, one group
// per part, and what serve read (the inputs) where it goes. The
// defaults are kong's, as serve parses them.
func TestServeConfig(t *testing.T) {
	t.Parallel()
	const did = "did:plc:7u2ld3ffgzqvezmv6wxgxiix"
	repo := ingest.Target{Owner: "did:plc:ewvi7nxzyoun6zhxrhs64oiz", Name: "hello"}
	defaults := func() daemon.Config {
		return daemon.Config{
			Account: daemon.Account{Runner: did},
			Sources: daemon.Sources{Targets: []ingest.Target{repo}},
			Intake: intake.Config{Poll: time.Minute, Firehose: true, Retention: 720 * time.Hour,
				Caps: intake.Caps{WorkflowsPerEvent: 20, QueuedPerAuthor: 20, CheckWritesPerAuthor: 200}},
			Scheduler: scheduler.Config{Concurrency: 1},
			Lander:    lander.Config{Batch: 8},
			Engine: run.Config{
				DefaultImage: "busybox:stable",
				Checkout:     run.Bound{Limits: tarstream.Limits{MaxBytes: 2147483648, MaxFiles: 200000}, BytesName: "--max-checkout", FilesName: "--max-files"},
				Outputs:      run.Bound{Limits: tarstream.Limits{MaxBytes: 1073741824, MaxFiles: 200000}, BytesName: "--max-outputs", FilesName: "--max-files"},
			},
			Git:      mirror.Options{Timeout: 5 * time.Minute, MaxWorkflowBytes: 262144, MaxWorkflows: 100, MaxCheckoutBytes: 2147483648},
			StateDir: "/var/lib/knotless", CacheDir: "/var/cache/knotless", StopWait: 10 * time.Minute,
			LogBlobs: checks.LogBlobsAlways,
		}
	}
	for _, tc := range []struct {
		name string
		args []string
		want func(c *daemon.Config)
		err  string
	}{
		{"defaults", nil, func(*daemon.Config) {}, ""},
		{"the account", []string{"--pds", "https://pds.test"}, func(c *daemon.Config) { c.Account.PDS = "https://pds.test" }, ""},
		{"metrics", []string{"--metrics-listen", "127.0.0.1:9465"}, func(c *daemon.Config) { c.Telemetry.Listen = "127.0.0.1:9465" }, ""},
		{"the sources", []string{"--discover", "--pulls", "--relay", "https://relay.test"}, func(c *daemon.Config) {
			c.Sources.Discover, c.Sources.Pulls, c.Sources.Relay = true, true, "https://relay.test"
		}, ""},
		{"intake", []string{"--poll", "2m", "--retention", "24h", "--max-workflows-per-event", "5", "--max-queued-per-author", "0",
			"--max-check-writes-per-author", "9"}, func(c *daemon.Config) {
			c.Intake.Poll, c.Intake.Retention = 2*time.Minute, 24*time.Hour
			c.Intake.Caps = intake.Caps{WorkflowsPerEvent: 5, QueuedPerAuthor: intake.NoCap, CheckWritesPerAuthor: 9}
		}, ""},
		{"the scheduler", []string{"--concurrency", "4", "--stop-wait", "1m"}, func(c *daemon.Config) {
			c.Scheduler.Concurrency, c.StopWait = 4, time.Minute
		}, ""},
		{"warm pods", []string{"--warm-pods", "2"}, func(c *daemon.Config) { c.WarmPods = 2 }, ""},
		{"log blobs", []string{"--log-blobs", "failures"}, func(c *daemon.Config) { c.LogBlobs = checks.LogBlobsFailures }, ""},
		{"the lander", []string{"--queue", "--queue-batch", "3"}, func(c *daemon.Config) { c.Lander.Queue, c.Lander.Batch = true, 3 }, ""},
		{"the engine", []string{"--image", "busybox:1", "--max-timeout", "1h", "--max-cpu", "2", "--max-memory", "1Gi",
			"--allow-image", "busybox:*", "--limits-apply-to", "all", "--max-checkout", "0", "--max-outputs", "5", "--max-files", "7"}, func(c *daemon.Config) {
			c.Engine.DefaultImage = "busybox:1"
			c.Engine.Max = run.Maximums{Timeout: time.Hour, MilliCPU: 2000, MemoryBytes: 1 << 30, Images: []string{"busybox:*"}, All: true}
			c.Engine.Checkout.Limits = tarstream.Limits{MaxBytes: 0, MaxFiles: 7}
			c.Engine.Outputs.Limits = tarstream.Limits{MaxBytes: 5, MaxFiles: 7}
			c.Git.MaxCheckoutBytes = tarstream.DefaultMaxBytes // 0 is the default, never no bound
		}, ""},
		{"git", []string{"--allow-local-sources", "--allow-http-sources", "--git-timeout", "1m", "--max-workflow-bytes", "10", "--max-workflows", "2"},
			func(c *daemon.Config) {
				c.Git.Policy = mirror.Policy{AllowLocal: true, AllowHTTP: true}
				c.Git.Timeout, c.Git.MaxWorkflowBytes, c.Git.MaxWorkflows = time.Minute, 10, 2
			}, ""},
		{"directories and the shell override", []string{"--state-dir", "/s", "--cache-dir", "/c", "--unsafe-shell-untrusted"}, func(c *daemon.Config) {
			c.StateDir, c.CacheDir, c.UnsafeShellUntrusted = "/s", "/c", true
		}, ""},
		{"live output", []string{"--listen", "127.0.0.1:8788", "--public-url", "https://ci.example", "--output-service", "https://out.example",
			"--output-service-did", "did:web:out.example"}, func(c *daemon.Config) {
			c.Live = live.Config{Listen: "127.0.0.1:8788", PublicURL: "https://ci.example", Service: "https://out.example", ServiceDID: "did:web:out.example"}
		}, ""},
		{"classes", []string{"--class", "large:cpu=4,memory=8Gi,node-selector=pool=big,toleration=ci:NoSchedule", "--class", "default:ephemeral-storage=2Gi",
			"--class", "small:cpu=1,untrusted"}, func(c *daemon.Config) {
			set, err := class.NewSet([]class.Class{
				{Name: "large", CPU: "4", Memory: "8Gi", NodeSelector: map[string]string{"pool": "big"}, Tolerations: []class.Toleration{{Key: "ci", Effect: "NoSchedule"}}},
				{Name: "default", EphemeralStorage: "2Gi"},
				{Name: "small", CPU: "1", Untrusted: true},
			})
			if err != nil {
				t.Fatal(err)
			}
			c.Engine.Classes = set
		}, ""},
		{"a class twice", []string{"--class", "a:cpu=1", "--class", "a:cpu=2"}, nil, "--class: class a is defined twice"},
		{"a class Kubernetes cannot apply", []string{"--class", "big:pids=100"}, nil, "--class big: pids: a Kubernetes pod has no process bound of its own"},
		{"a class Docker cannot apply", []string{"--executor", "docker", "--class", "big:cpu=2,node-selector=pool=big"}, nil, "--class big: node-selector: the docker executor cannot apply it"},
		{"a class the shell cannot apply", []string{"--executor", "shell", "--class", "big:cpu=2"}, nil, "--class big: cpu, memory and pids: the shell executor cannot apply it"},
		{"a bad class", []string{"--class", "big:disk=1Gi"}, nil, "--class big: disk=1Gi: unknown key disk"},
		{"no did", []string{"--did", ""}, nil, "--did (the runner's DID) is required"},
		{"a bad did", []string{"--did", "nope"}, nil, `--did "nope"`},
		{"a bad repository", []string{"--", "nope"}, nil, `repo "nope"`},
		{"a bad maximum", []string{"--max-cpu", "lots"}, nil, "--max-cpu"},
		{"a negative cap", []string{"--max-queued-per-author=-1"}, nil, "--max-queued-per-author -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"serve", "--did", did}, tc.args...)
			if !strings.Contains(strings.Join(tc.args, " "), "-- ") {
				args = append(args, "--", repo.String())
			}
			root, _, err := parseServe(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			got, err := root.Serve.config(serveInputs{})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := defaults()
			tc.want(&want)
			opts := []cmp.Option{cmpopts.IgnoreFields(daemon.Account{}, "Directory"), cmpopts.EquateEmpty(),
				cmp.Comparer(func(a, b class.Set) bool { return cmp.Equal(a.All(), b.All(), cmpopts.EquateEmpty()) })}
			if diff := cmp.Diff(want, got, opts...); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			if got.Account.Directory == nil {
				t.Error("no directory to resolve DIDs with")
			}
		})
	}
}

// TestServeConfigInputs: what serve read goes where the parts take it.
func TestServeConfigInputs(t *testing.T) {
	t.Parallel()
	root, _, err := parseServe(t, "serve", "--did", "did:plc:7u2ld3ffgzqvezmv6wxgxiix", "--", "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello")
	if err != nil {
		t.Fatal(err)
	}
	ex := shell.New(shell.Config{})
	notified := ""
	log := slog.New(slog.DiscardHandler)
	secrets := []scheduler.OperatorSecret{{Name: "A", Value: "b", Repos: []string{scheduler.AnyRepo}}}
	creds := mirror.PushCredentials{{}}
	got, err := root.Serve.config(serveInputs{Executor: ex, Password: "pw", Secrets: secrets, PushCredentials: creds,
		Notify: func(s string) { notified = s }, Watchdog: time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	got.Notify("READY=1")
	if got.Engine.Executor != ex || got.Account.Password != "pw" || got.Watchdog != time.Second || got.Logger != log || notified != "READY=1" ||
		!cmp.Equal(got.Scheduler.Secrets, secrets) || len(got.PushCredentials) != 1 {
		t.Errorf("inputs not in place: %+v", got)
	}
}
