package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
)

const (
	ctlRunner = "did:plc:7u2ld3ffgzqvezmv6wxgxiix"
	ctlKey    = "zsvmur6bdrvdcvafwfoo7mmwp4"
	ctlCheck  = "at://" + ctlRunner + "/dev.knotless.check/" + ctlKey
)

// decodeRecord validates the command's stdout as a record of collection.
func decodeRecord(t *testing.T, collection, stdout string, v any) {
	t.Helper()
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.Decode(collection, []byte(stdout), v); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
}

func TestCancelPrintsTheRecord(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want forge.Cancel
		call string
	}{
		{"by the check's AT-URI", []string{"cancel", "--print", ctlCheck},
			forge.Cancel{Type: forge.CollectionCancel, Check: ctlKey, Runner: ctlRunner},
			`com.atproto.repo.putRecord {"repo": "YOUR-DID", "collection": "dev.knotless.cancel", "rkey": "` + forge.CancelKey(ctlRunner, ctlKey) + `"`},
		{"by key and repository, every runner", []string{"cancel", "--print", "--check", ctlKey, "--repo", repoA},
			forge.Cancel{Type: forge.CollectionCancel, Check: ctlKey, Repo: repoA},
			`"rkey": "` + forge.CancelKey("", ctlKey) + `"`},
		{"by key, one runner", []string{"cancel", "--print", "--check", ctlKey, "--repo", repoA, "--runner", ctlRunner},
			forge.Cancel{Type: forge.CollectionCancel, Check: ctlKey, Repo: repoA, Runner: ctlRunner},
			`"rkey": "` + forge.CancelKey(ctlRunner, ctlKey) + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, tc.args...)
			if r.code != ExitSuccess {
				t.Fatalf("exit %d\n%s", r.code, r.stderr)
			}
			var got forge.Cancel
			decodeRecord(t, forge.CollectionCancel, r.stdout, &got)
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(forge.Cancel{}, "CreatedAt")); diff != "" {
				t.Errorf("record (-want +got):\n%s", diff)
			}
			if !strings.Contains(r.stderr, tc.call) {
				t.Errorf("stderr lacks the call %q:\n%s", tc.call, r.stderr)
			}
		})
	}
}

func TestRerunPrintsTheRecord(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "rerun", "--print", "--check", ctlCheck, "--failed", "--env", "DEBUG=1", "--env", "OPTS=a=b,c", "--env", "EMPTY=")
	if r.code != ExitSuccess {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	var got forge.Rerun
	decodeRecord(t, forge.CollectionRerun, r.stdout, &got)
	want := forge.Rerun{Type: forge.CollectionRerun, Check: ctlKey, Runner: ctlRunner, Failed: true,
		Env: []forge.Variable{{Name: "DEBUG", Value: "1"}, {Name: "OPTS", Value: "a=b,c"}, {Name: "EMPTY", Value: ""}}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(forge.Rerun{}, "CreatedAt")); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
	if !strings.Contains(r.stderr, `com.atproto.repo.createRecord {"repo": "YOUR-DID", "collection": "dev.knotless.rerun"`) {
		t.Errorf("stderr lacks the call:\n%s", r.stderr)
	}

	r = runCLI(t, nil, "rerun", "--print", "--check", ctlKey, "--repo", repoA, "--workflow", "build")
	var one forge.Rerun
	decodeRecord(t, forge.CollectionRerun, r.stdout, &one)
	if diff := cmp.Diff(forge.Rerun{Type: forge.CollectionRerun, Check: ctlKey, Repo: repoA, Workflow: "build"}, one,
		cmpopts.IgnoreFields(forge.Rerun{}, "CreatedAt")); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
}

func TestDispatchPrintsTheRecord(t *testing.T) {
	t.Parallel()
	file := "testdata/control/deploy.yaml"
	r := runCLI(t, nil, "dispatch", "--print", "--repo", repoA, "--ref", "main", "--workflow-file", file, "--input", "note=hi, there", "--input", "target=production")
	if r.code != ExitSuccess {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	var got forge.Dispatch
	decodeRecord(t, forge.CollectionDispatch, r.stdout, &got)
	want := forge.Dispatch{Type: forge.CollectionDispatch, Repo: repoA, Ref: "refs/heads/main", Workflow: "deploy",
		Inputs: []forge.Variable{{Name: "note", Value: "hi, there"}, {Name: "target", Value: "production"}}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(forge.Dispatch{}, "CreatedAt")); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
	if !strings.Contains(r.stderr, `com.atproto.repo.createRecord {"repo": "YOUR-DID", "collection": "dev.knotless.dispatch"`) {
		t.Errorf("stderr lacks the call:\n%s", r.stderr)
	}

	// Without a workflow file nothing is known of the inputs: they go as given.
	r = runCLI(t, nil, "dispatch", "--print", "--repo", repoA, "--ref", "refs/heads/release/1", "--workflow", "deploy", "--runner", ctlRunner, "--input", "any=thing")
	var loose forge.Dispatch
	decodeRecord(t, forge.CollectionDispatch, r.stdout, &loose)
	if diff := cmp.Diff(forge.Dispatch{Type: forge.CollectionDispatch, Repo: repoA, Ref: "refs/heads/release/1", Workflow: "deploy", Runner: ctlRunner,
		Inputs: []forge.Variable{{Name: "any", Value: "thing"}}}, loose, cmpopts.IgnoreFields(forge.Dispatch{}, "CreatedAt")); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
}

// TestControlCommandsRefuse: what can be checked without the network is,
// the error names the flag, and the exit code is the command line's
// (ExitConfig) as for an unknown flag.
func TestControlCommandsRefuse(t *testing.T) {
	t.Parallel()
	deploy := "testdata/control/deploy.yaml"
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"cancel: nothing named", []string{"cancel"}, "name the check: at://RUNNER/dev.knotless.check/KEY, RUNNER/KEY, or its key"},
		{"cancel: both forms", []string{"cancel", ctlCheck, "--check", ctlKey}, "give the check once"},
		{"cancel: a key without --repo, printed", []string{"cancel", "--print", ctlKey}, "CHECK " + ctlKey + ": with --print, a check's key needs --repo"},
		{"cancel: not a check's URI", []string{"cancel", "at://" + ctlRunner + "/dev.knotless.pull/x"}, "CHECK \"at://" + ctlRunner + "/dev.knotless.pull/x\": want at://RUNNER-DID/dev.knotless.check/KEY"},
		{"cancel: a runner by handle", []string{"cancel", "at://runner.test/dev.knotless.check/" + ctlKey}, "name the runner by its DID"},
		{"cancel: another runner", []string{"cancel", ctlCheck, "--runner", "did:plc:ewvi7nxzyoun6zhxrhs64oiz"}, "--runner did:plc:ewvi7nxzyoun6zhxrhs64oiz: the check"},
		{"cancel: a bad key", []string{"cancel", "a b", "--repo", repoA}, "CHECK \"a b\": not a check's AT-URI, RUNNER/KEY or key"},
		{"cancel: a bad repo", []string{"cancel", "--print", ctlKey, "--repo", "at://alice.test/dev.knotless.repo/x"}, "--repo: repo"},
		{"cancel: a bad runner", []string{"cancel", ctlKey, "--repo", repoA, "--runner", "bob"}, "--runner:"},
		{"rerun: workflow and failed", []string{"rerun", "--check", ctlCheck, "--workflow", "a", "--failed"}, "--workflow and --failed can't be used together"},
		{"rerun: env without =", []string{"rerun", "--check", ctlCheck, "--env", "DEBUG"}, `--env "DEBUG": want NAME=VALUE`},
		{"rerun: env not a shell name", []string{"rerun", "--check", ctlCheck, "--env", "A-B=1"}, `--env: run variable "A-B": not a shell variable name`},
		{"rerun: env reserved", []string{"rerun", "--check", ctlCheck, "--env", "KNOTLESS_RUN_ID=x"}, `--env: run variable "KNOTLESS_RUN_ID": KNOTLESS_ is reserved`},
		{"rerun: env names a granted secret", []string{"rerun", "--check", ctlCheck, "--env", "TOKEN=x", "--workflow-file", deploy}, `--env: run variable "TOKEN": the workflow grants a secret of that name`},
		{"rerun: env given twice", []string{"rerun", "--check", ctlCheck, "--env", "A=1", "--env", "A=2"}, `--env: run variable "A": given twice`},
		{"rerun: a bad workflow file", []string{"rerun", "--check", ctlCheck, "--workflow-file", "testdata/control/badcron.yaml"}, "--workflow-file: testdata/control/badcron.yaml:3:13"},
		{"dispatch: a tag", []string{"dispatch", "--repo", repoA, "--ref", "refs/tags/v1", "--workflow", "deploy"}, `--ref "refs/tags/v1": want a branch`},
		{"dispatch: no workflow", []string{"dispatch", "--repo", repoA, "--ref", "main"}, "--workflow: name the workflow"},
		{"dispatch: a bad repo", []string{"dispatch", "--repo", "a/b/c", "--ref", "main", "--workflow", "w"}, `--repo: repo "a/b/c"`},
		{"dispatch: a bad runner", []string{"dispatch", "--repo", repoA, "--ref", "main", "--workflow", "w", "--runner", "bob"}, "--runner:"},
		{"dispatch: input without =", []string{"dispatch", "--repo", repoA, "--ref", "main", "--workflow", "w", "--input", "x"}, `--input "x": want NAME=VALUE`},
		{"dispatch: another workflow than the file", []string{"dispatch", "--repo", repoA, "--ref", "main", "--workflow", "w", "--workflow-file", deploy}, "--workflow w: --workflow-file testdata/control/deploy.yaml is workflow deploy"},
		{"dispatch: required input missing", []string{"dispatch", "--repo", repoA, "--ref", "main", "--workflow-file", deploy}, `--input: workflow deploy: input "note": required, and not given`},
		{"dispatch: unknown input", []string{"dispatch", "--repo", repoA, "--ref", "main", "--workflow-file", deploy, "--input", "note=x", "--input", "nope=1"}, `--input: workflow deploy: input "nope": not an input of the workflow (known: target, dry_run, note)`},
		{"dispatch: a bad choice", []string{"dispatch", "--repo", repoA, "--ref", "main", "--workflow-file", deploy, "--input", "note=x", "--input", "target=prod"}, `input "target": "prod" is not one of the options (staging, production)`},
		{"dispatch: a bad boolean", []string{"dispatch", "--repo", repoA, "--ref", "main", "--workflow-file", deploy, "--input", "note=x", "--input", "dry_run=yes"}, `input "dry_run": want true or false, got "yes"`},
		{"dispatch: not on dispatch", []string{"dispatch", "--repo", repoA, "--ref", "main", "--workflow-file", "testdata/unacted/later.yaml"}, "does not run on dispatch"},
		{"dispatch: a branch the workflow does not run for", []string{"dispatch", "--repo", repoA, "--ref", "dev", "--workflow-file", "testdata/control/main-only.yaml"}, "--ref refs/heads/dev: workflow main-only does not run for this branch (branches: main)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, nil, tc.args...)
			// The command line is wrong: one exit code, whether kong
			// or the command finds it.
			code := ExitConfig
			if r.code != code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit %d and %q", r.code, r.stderr, code, tc.want)
			}
			if r.stdout != "" {
				t.Errorf("a refused record was printed:\n%s", r.stdout)
			}
		})
	}
}
