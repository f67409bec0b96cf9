package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/lib/version"
)

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), args, Env{
		Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
		Getenv: func(k string) string {
			if v, ok := env[k]; ok || k != "PATH" {
				return v
			}
			return os.Getenv("PATH") // steps find their tools where the tests do
		},
	})
	return result{code, stdout.String(), stderr.String()}
}

func readResult(t *testing.T, name string) run.Result {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var res run.Result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestRunExampleWithShell(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	outputs, resultFile, logFile := filepath.Join(dir, "out"), filepath.Join(dir, "result.json"), filepath.Join(dir, "run.log")
	r := runCLI(t, nil, "run", "--executor", "shell", "--shell-root", filepath.Join(dir, "runs"),
		"--workflow", "../../examples/hello/.knotless/workflows/build.yaml", "--workdir", "../../examples/hello",
		"--outputs", outputs, "--result", resultFile, "--log", logFile)
	if r.code != ExitSuccess {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	res := readResult(t, resultFile)
	var names []string
	for _, s := range res.Steps {
		names = append(names, s.Name+":"+string(s.Status))
	}
	if diff := cmp.Diff([]string{"inspect:success", "build:success", "publish:success"}, names); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	sum, err := os.ReadFile(filepath.Join(outputs, "greeting.sha256"))
	if err != nil || !strings.Contains(string(sum), "greeting.txt") {
		t.Errorf("output greeting.sha256 = %q, %v", sum, err)
	}
	log, _ := os.ReadFile(logFile)
	for _, want := range []string{"==> step 2/3: build", "<== step build: success, exit 0", "hello from knotless-run"} {
		if !strings.Contains(string(log), want) || !strings.Contains(r.stdout, want) {
			t.Errorf("log file and live output should contain %q", want)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "runs")); len(entries) != 0 {
		t.Errorf("run directory left behind: %v", entries)
	}
}

// TestRunResultToStdout: with --result -, stdout is the result JSON and
// nothing else, so `run --result - | jq` works; the steps' output and
// the closing line go to stderr.
func TestRunResultToStdout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runCLI(t, nil, "run", "--executor", "shell", "--shell-root", filepath.Join(dir, "runs"),
		"--workflow", "../../examples/hello/.knotless/workflows/build.yaml", "--workdir", "../../examples/hello",
		"--outputs", filepath.Join(dir, "out"), "--result", "-")
	if r.code != ExitSuccess {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	var res run.Result
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		t.Fatalf("stdout is not the result JSON: %v\n%s", err, r.stdout)
	}
	if rest, _ := io.ReadAll(dec.Buffered()); strings.TrimSpace(string(rest)) != "" || dec.More() {
		t.Errorf("stdout has more than the result JSON:\n%s", r.stdout)
	}
	if res.Status != run.Success || len(res.Steps) != 3 {
		t.Errorf("result %s with %d steps, want success with 3", res.Status, len(res.Steps))
	}
	for _, want := range []string{"hello from knotless-run", "<== step build: success, exit 0", "knotless-run: workflow build: success"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
}

func TestRunStatusesAndExitCodes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	failing := filepath.Join(dir, "fail.tsv")
	if err := os.WriteFile(failing, []byte("ok\ttrue\nbad\texit 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStatus run.Status
		wantError  string
	}{
		{"failing step", []string{"--steps-file", failing, "--workdir", dir}, ExitFailure, run.Failure, `step "bad" exited with code 7`},
		{"missing workdir", []string{"--steps-file", failing, "--workdir", filepath.Join(dir, "missing")}, ExitError, run.Error, "checkout " + filepath.Join(dir, "missing")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resultFile := filepath.Join(t.TempDir(), "result.json")
			args := append([]string{"run", "--executor", "shell", "--shell-root", t.TempDir(), "--result", resultFile}, tt.args...)
			r := runCLI(t, nil, args...)
			if r.code != tt.wantCode {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tt.wantCode, r.stdout, r.stderr)
			}
			res := readResult(t, resultFile)
			if res.Status != tt.wantStatus || !strings.Contains(res.Error, tt.wantError) {
				t.Errorf("result %s %q, want %s %q", res.Status, res.Error, tt.wantStatus, tt.wantError)
			}
		})
	}
}

func TestRunBadInput(t *testing.T) {
	t.Parallel()
	wf := "../../examples/hello/.knotless/workflows/build.yaml"
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
		code int // ExitError when 0
	}{
		{"secret value on argv", []string{"run", "--executor", "shell", "--workflow", wf, "--secret", "TOKEN=hunter2"}, nil,
			"--secret TOKEN: a value is never taken from the command line", ExitConfig},
		{"secret missing from env", []string{"run", "--executor", "shell", "--workflow", wf, "--secret", "TOKEN"}, nil,
			"--secret TOKEN: the environment variable TOKEN is empty or unset", ExitConfig},
		{"kubernetes is the default and needs credentials", []string{"run", "--workflow", wf}, nil,
			"--executor kubernetes: no cluster credentials: give --kubeconfig, set KUBECONFIG", 0},
		{"pull secret that is no Secret name", []string{"run", "--workflow", wf, "--image-pull-secret", "ok=registry.example.com/*", "--image-pull-secret", "Bad_Name=registry.example.com/*"}, nil,
			`--image-pull-secret "Bad_Name=registry.example.com/*": "Bad_Name" is not a Secret name: a lowercase RFC 1123 subdomain`, ExitConfig},
		{"pull secret without a pattern", []string{"run", "--workflow", wf, "--image-pull-secret", "ci-pull"}, nil,
			`--image-pull-secret "ci-pull": no image pattern: write NAME=PATTERN (e.g. ci-pull=registry.example.com/team/*), adding ,untrusted to give the secret to pulls too`, ExitConfig},
		{"no workflow", []string{"run", "--executor", "shell"}, nil, "missing flags: --workflow=FILE or --steps-file=FILE", ExitConfig},
		{"bad workflow", []string{"run", "--executor", "shell", "--workflow", "testdata/bad.yaml"}, nil,
			`testdata/bad.yaml:3:1: workflow: unknown field "stepz"`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, tt.env, tt.args...)
			code := tt.code
			if code == 0 {
				code = ExitError
			}
			if r.code != code || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit %d and %q", r.code, r.stderr, code, tt.want)
			}
		})
	}
}

func TestDryRunMasksSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wf := filepath.Join(dir, "w.yaml")
	if err := os.WriteFile(wf, []byte("on: push\nsecrets: [TOKEN]\nsteps:\n  - {name: s, secrets: [TOKEN], run: 'echo hi'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, map[string]string{"TOKEN": "hunter2"}, "run", "--executor", "shell", "--dry-run", "--workflow", wf, "--secret", "TOKEN")
	if r.code != 0 || strings.Contains(r.stdout, "hunter2") || !strings.Contains(r.stdout, "export TOKEN='***'") {
		t.Errorf("exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "validate", "testdata/bad.yaml", "../../examples/hello/.knotless/workflows")
	want := []string{
		`testdata/bad.yaml:2:10: timeout: want a positive duration like 90s or 10m, got "soon"`,
		`testdata/bad.yaml:3:1: workflow: unknown field "stepz"`,
		"../../examples/hello/.knotless/workflows/build.yaml: ok",
	}
	for _, w := range want {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("validate output lacks %q:\n%s", w, r.stdout)
		}
	}
	if r.code != ExitFailure {
		t.Errorf("exit %d, want %d", r.code, ExitFailure)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	if r := runCLI(t, nil, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "knotless-run ") {
		t.Errorf("version: %d %q", r.code, r.stdout)
	}
}

func TestManifestsCommand(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "manifests", "--image", "knotless-run:v1", "--did", "did:plc:runner",
		"--serve-flag=--plc-url", "--serve-flag=http://plc.example", "did:plc:owner/app")
	if r.code != 0 || !strings.Contains(r.stdout, "kind: StatefulSet") || !strings.Contains(r.stdout, "- --plc-url\n        - http://plc.example\n        - did:plc:owner/app") {
		t.Errorf("manifests: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	// Without --image: the name and tag the flake's image and
	// deploy/image give (nix/image.json's name, the version).
	if r := runCLI(t, nil, "manifests", "--did", "did:plc:runner"); r.code != 0 || !strings.Contains(r.stdout, "image: knotless-run:"+version.Version+"\n") {
		t.Errorf("manifests without --image: exit %d, stderr %q, stdout:\n%s", r.code, r.stderr, r.stdout)
	}
}

// TestConfigErrorExitCode: what no restart can mend (a settings key that
// is no flag, a bad value) exits 78, which the systemd units'
// RestartPreventExitStatus= stops on; an error of the runner at work exits 2.
func TestConfigErrorExitCode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown settings key", []string{"serve", "--config", write("typo.json", `{"concurency": 2}`)}, ExitConfig, "unknown keys concurency"},
		{"bad value", []string{"serve", "--config", write("bad.json", `{"stop-wait": "ten minutes"}`)}, ExitConfig, "stop-wait"},
		{"unknown flag", []string{"serve", "--no-such-flag"}, ExitConfig, "--no-such-flag"},
		{"cannot sign in", []string{"serve", "--did", freshRunner(), "--executor", "shell", "--pds", "http://127.0.0.1:1",
			"--plc-url", "http://127.0.0.1:1", "--app-password-file", write("pw", "x"), "--state-dir", dir, "--cache-dir", dir,
			"--", "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello"}, ExitError, "log in to http://127.0.0.1:1"},
		// A file that does not read is no configuration error: it may
		// be there at the next start.
		{"a secret's file that does not read", []string{"serve", "--did", "did:plc:7u2ld3ffgzqvezmv6wxgxiix", "--executor", "shell", "--pds", "http://127.0.0.1:1",
			"--plc-url", "http://127.0.0.1:1", "--state-dir", dir, "--cache-dir", dir,
			"--secrets-file", write("secrets.json", `{"secrets": [{"name": "T", "file": "not-there", "repos": ["*"]}]}`),
			"--", "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello"}, ExitError, filepath.Join(dir, "not-there")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit %d and %q", r.code, r.stderr, tt.code, tt.want)
			}
		})
	}
}

// TestMisuseExitsConfig: a command line that cannot work as written (a
// missing or contradictory flag, a value of the wrong form, a rule
// between flags, a settings file that says the wrong thing) exits
// ExitConfig in every command, whether kong or the command finds it, as
// docs/reference/cli.md says; never ExitError, which says trying again
// may help.
func TestMisuseExitsConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	steps := write("steps", "hi\techo hi\n")
	runner, owner := "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
	repo := owner + "/hello"
	// serve as far as its flags: loopback only, nothing listens there.
	serve := func(args ...string) []string {
		state := t.TempDir()
		return append([]string{"serve", "--executor", "shell", "--pds", "http://127.0.0.1:1", "--plc-url", "http://127.0.0.1:1",
			"--state-dir", state, "--cache-dir", state, "--shell-root", state}, args...)
	}
	seal := func(args ...string) []string {
		return append([]string{"secret", "seal", "--runner", runner, "--key", "AAAA", "--repo", "at://" + owner + "/dev.knotless.repo/hello", "--name", "TOKEN"}, args...)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string // what stderr names
	}{
		{"run: a secret's value on the command line", []string{"run", "--executor", "shell", "--steps-file", steps, "--dry-run", "--secret", "TOKEN=hunter2"}, "--secret TOKEN: a value is never taken from the command line"},
		{"run: a secret from an unset variable", []string{"run", "--executor", "shell", "--steps-file", steps, "--dry-run", "--secret", "TOKEN"}, "--secret TOKEN: the environment variable TOKEN is empty or unset"},
		{"run: a maximum that is no quantity", []string{"run", "--executor", "shell", "--steps-file", steps, "--dry-run", "--max-cpu", "lots"}, "--max-cpu"},
		{"run: a negative cache bound", []string{"run", "--executor", "shell", "--steps-file", steps, "--cache-dir", dir, "--cache-max=-1"}, "--cache-max -1"},
		{"run: a toleration of the wrong form", []string{"run", "--executor", "kubernetes", "--steps-file", steps, "--toleration", "gpu"}, "--toleration \"gpu\""},
		{"run: an egress block that is no address", []string{"run", "--executor", "kubernetes", "--steps-file", steps, "--egress-block", "nowhere"}, "--egress-block \"nowhere\""},
		{"run: a client rate of 0", []string{"run", "--executor", "kubernetes", "--steps-file", steps, "--kube-qps", "0"}, "--kube-qps 0"},
		{"run: a client rate that is no number", []string{"run", "--executor", "kubernetes", "--steps-file", steps, "--kube-qps", "fast"}, "--kube-qps"},
		{"run: a client burst below 1", []string{"run", "--executor", "kubernetes", "--steps-file", steps, "--kube-burst", "0"}, "--kube-burst 0"},
		{"serve: a negative client rate", serve("--did", runner, "--executor", "kubernetes", "--kube-qps=-1", repo), "--kube-qps -1"},
		{"run: a docker CPU limit that is no quantity", []string{"run", "--executor", "docker", "--steps-file", steps, "--docker-cpu", "lots"}, "--executor docker: docker default cpu"},
		{"cache rm: --all with --workflow", []string{"cache", "rm", "--cache-dir", dir, "--all", "--workflow", "build"}, "--workflow and --path go with --repo, not --all"},
		{"output-service: a bound of 0", []string{"output-service", "--data-dir", dir, "--runner", runner, "--service-did", "did:web:out.test", "--max-subscribers", "0"}, "must be positive"},
		{"output-service: a runner that is no DID", []string{"output-service", "--data-dir", dir, "--runner", "bob", "--service-did", "did:web:out.test"}, "--runner \"bob\""},
		{"serve: no --did", []string{"serve", repo}, "--did (the runner's DID) is required"},
		{"serve: a --did that is no DID", serve("--did", "runner", repo), "--did \"runner\""},
		{"serve: a repository of the wrong form", serve("--did", runner, "--", owner+"/"), "repo \"" + owner + "/\""},
		{"serve: no repositories", serve("--did", runner), "no repositories"},
		{"serve: warm pods without kubernetes", serve("--did", runner, "--warm-pods", "2", repo), "--warm-pods 2"},
		{"serve: a flood cap below 0", serve("--did", runner, "--max-queued-per-author=-1", repo), "--max-queued-per-author -1"},
		{"serve: --output-service-did alone", serve("--did", runner, "--output-service-did", "did:web:out.test", repo), "--output-service-did without --output-service"},
		{"serve: a negative cache bound", serve("--did", runner, "--disk-floor=-1", repo), "--disk-floor -1"},
		{"serve: a secrets file that says the wrong thing", serve("--did", runner, "--secrets-file", write("secrets.json", `{"secrets": [{"name": "T", "value": "v"}]}`), repo), "--secrets-file"},
		{"kubeconfig: nothing to do", []string{"kubeconfig"}, "--admin-kubeconfig and --out are required"},
		{"kubeconfig: two things to check", []string{"kubeconfig", "--check-in-cluster", "--check", "x"}, "not both"},
		{"manifests: a flag the manifests set", []string{"manifests", "--did", runner, "--serve-flag=--did", "--serve-flag=" + runner}, "--serve-flag --did"},
		{"manifests: a Secret name of the wrong form", []string{"manifests", "--did", runner, "--allow-image-pull-secret", "Not_A_Name"}, "--allow-image-pull-secret \"Not_A_Name\""},
		{"secret seal: a runner that is no DID", seal("--runner", "runner"), "--runner"},
		{"secret seal: a key that is no key", seal(), "--key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, map[string]string{}, tt.args...)
			if r.code != ExitConfig || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit %d naming %q", r.code, r.stderr, ExitConfig, tt.want)
			}
		})
	}
}

// A runner with no app password and no saved session is told where the
// password goes: --app-password-file, and its default under systemd's
// CREDENTIALS_DIRECTORY (issue 35). Login fails before any request.
func TestServeNoAppPassword(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"nothing", nil, nil, []string{"--app-password-file FILE", "$CREDENTIALS_DIRECTORY/app-password", "CREDENTIALS_DIRECTORY is not set"}},
		{"credentials directory without it", map[string]string{"CREDENTIALS_DIRECTORY": dir}, nil,
			[]string{"--app-password-file FILE", filepath.Join(dir, "app-password") + " does not exist"}},
		{"an empty file", nil, []string{"--app-password-file", empty}, []string{"--app-password-file " + empty + " is empty"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			args := append([]string{"serve", "--did", freshRunner(), "--executor", "shell", "--pds", "http://127.0.0.1:1",
				"--plc-url", "http://127.0.0.1:1", "--state-dir", state, "--cache-dir", state}, tt.args...)
			r := runCLI(t, tt.env, append(args, "--", "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello")...)
			if r.code != ExitError || !strings.Contains(r.stderr, "no app password and no usable saved session in --state-dir "+state) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d and no app password", r.code, r.stderr, ExitError)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

// TestJSONLogDurations: a duration in a JSON log line is a string, as
// "1.5s", not its nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	log := newLogger(&b, "json", "info").With("ttl", 2*time.Minute)
	log.WithGroup("run").Info("stopped", "stopped_in", 1500*time.Millisecond)
	got := b.String()
	for _, want := range []string{`"ttl":"2m0s"`, `"1.5s"`} {
		if !strings.Contains(got, want) {
			t.Errorf("log line %s lacks %s", got, want)
		}
	}
}

// TestMistypedCommand: a word that is no command is an error naming the
// nearest one, not a repository for serve; a repository still is one.
func TestMistypedCommand(t *testing.T) {
	t.Parallel()
	for word, want := range map[string]string{"lgoin": `"login"`, "wacth": `"watch"`, "rnus": `"runs"`, "xyzzyplugh": "knotless-run --help"} {
		r := runCLI(t, nil, word)
		if r.code != ExitConfig || !strings.Contains(r.stderr, `unknown command "`+word+`"`) || !strings.Contains(r.stderr, want) || strings.Contains(r.stderr, "--did") {
			t.Errorf("knotless-run %s: exit %d, stderr %q; want exit %d suggesting %s", word, r.code, r.stderr, ExitConfig, want)
		}
	}
	if got := editDistance("lgoin", "login"); got != 1 {
		t.Errorf("editDistance(lgoin, login) = %d", got)
	}
	// A repository (OWNER/NAME) is serve's argument, as before.
	if r := runCLI(t, nil, "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello"); !strings.Contains(r.stderr, "--did") {
		t.Errorf("knotless-run OWNER/NAME: exit %d, stderr %q; want serve's", r.code, r.stderr)
	}
}

// TestStatusStateDirMissing: a --state-dir that is not there is an error
// naming the flag, not an idle runner.
func TestStatusStateDirMissing(t *testing.T) {
	t.Parallel()
	// The second is longer than a socket's path may be (108 bytes).
	for _, dir := range []string{filepath.Join(t.TempDir(), "nonexistent"), filepath.Join(t.TempDir(), strings.Repeat("x", 110), "nonexistent")} {
		r := runCLI(t, nil, "status", "--state-dir", dir)
		if r.code != ExitConfig || !strings.Contains(r.stderr, "--state-dir "+dir+": not a directory") {
			t.Errorf("status --state-dir %s (missing): exit %d, stdout %q, stderr %q", dir, r.code, r.stdout, r.stderr)
		}
	}
}

// freshRunner is a did:plc of its own for a serve that reaches the
// daemon with the shell executor: the daemon holds its runner on this
// host, so two such tests at once (here, or in another test binary on
// the host) must not share one.
func freshRunner() string {
	return "did:plc:" + strings.ToLower(rand.Text()[:24])
}
