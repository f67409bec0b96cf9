package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/parts/state"
)

// TestSecretSetFromTheTerminal drives secret set as a user types it,
// against the real PDS: logged in, the value typed on stdin, the
// command a process of its own. The sealed record lands in the owner's
// repo under the key derived from repository, name and runner, opens
// with the runner's key for that repository only, and a second set
// replaces it. The value is in no argv, no environment, no file of the
// user's, nothing the command prints, and not in the public record.
func TestSecretSetFromTheTerminal(t *testing.T) {
	t.Parallel()
	srv, w := startWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	password, err := w.Owner.AppPassword(ctx, "cli")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := forge.NewKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	u := newUser(t, srv.PLCURL)
	repo, runner := w.RepoURI.String(), w.Runner.DID.String()
	args := []string{"secret", "set", "--runner", runner, "--key", kp.PublicString(), "--repo", repo, "--name", "DEPLOY_TOKEN"}
	uri := syntax.ATURI("at://" + w.Owner.DID.String() + "/" + forge.CollectionSecret + "/" + forge.SecretKey(repo, "DEPLOY_TOKEN", runner))

	first := "deploy-token-first-7c1e93"
	if r := u.run(ctx, first+"\n", args...); r.code == ExitSuccess || !strings.Contains(r.stderr, "not logged in") {
		t.Errorf("secret set before login: exit %d, stderr %q; want it to ask for login", r.code, r.stderr)
	}
	if r := u.run(ctx, password+"\n", "login", w.Owner.DID.String(), "--plc-url", srv.PLCURL); r.code != ExitSuccess {
		t.Fatalf("login: exit %d\n%s", r.code, r.stderr)
	}

	for _, value := range []string{first, "deploy-token-second-40b2fd"} {
		// As the shell runs it: a process whose argv is what was
		// typed, the value piped to its stdin.
		cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^TestServeHelperProcess$", "--"}, args...)...)
		cmd.Env = append(os.Environ(), "KNOTLESS_SERVE_HELPER=1", "XDG_CONFIG_HOME="+u.config)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Its argv and environment as the system shows them to anyone
		// on the host, while it runs.
		seen := map[string][]byte{}
		for _, f := range []string{"cmdline", "environ"} {
			seen[f], _ = os.ReadFile(fmt.Sprintf("/proc/%d/%s", cmd.Process.Pid, f))
		}
		fmt.Fprintln(stdin, value)
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("secret set: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
		if !strings.Contains(stderr.String(), "wrote "+uri.String()) {
			t.Errorf("secret set does not say it wrote %s:\n%s", uri, stderr.String())
		}
		if slices.ContainsFunc(append(cmd.Args, cmd.Env...), func(s string) bool { return strings.Contains(s, value) }) {
			t.Error("the value is in the command's argv or environment")
		}
		for what, b := range map[string][]byte{"/proc/PID/cmdline": seen["cmdline"], "/proc/PID/environ": seen["environ"],
			"stdout": stdout.Bytes(), "stderr": stderr.Bytes()} {
			if bytes.Contains(b, []byte(value)) {
				t.Errorf("%s holds the value", what)
			}
		}
		scanFor(t, map[string]string{"the value": value}, nil, u.config)

		// The record on the PDS: sealed, opening to the value for this
		// repository and runner only.
		var rec forge.Secret
		if _, err := w.Reader.Get(ctx, uri, &rec); err != nil {
			t.Fatalf("the secret record is not on the PDS: %v", err)
		}
		if rec.Repo != repo || rec.Name != "DEPLOY_TOKEN" || rec.Runner != runner || rec.Key != kp.PublicString() || rec.Scope != forge.ScopePush {
			t.Errorf("record %+v", rec)
		}
		if raw := getRecord(t, srv.URL, uri); !bytes.Contains(raw, []byte(`"sealed"`)) || bytes.Contains(raw, []byte(value)) {
			t.Errorf("the public record holds the value in the clear, or no sealed value: %s", raw)
		}
		got, err := kp.OpenSecret(rec, repo, runner)
		if err != nil || string(got) != value {
			t.Errorf("the runner opens %q, %v; want %q", got, err, value)
		}
		if _, err := kp.OpenSecret(rec, forge.RepoURI(w.Owner.DID, "other").String(), runner); err == nil {
			t.Error("the sealed value opens for another repository")
		}
	}
}

// getRecord is the record at uri as anyone reads it from the PDS at
// base: com.atproto.repo.getRecord's answer, unauthenticated.
func getRecord(t *testing.T, base string, uri syntax.ATURI) []byte {
	t.Helper()
	q := url.Values{"repo": {uri.Authority().String()}, "collection": {uri.Collection().String()}, "rkey": {uri.RecordKey().String()}}
	resp, err := http.Get(base + "/xrpc/com.atproto.repo.getRecord?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("getRecord %s: %s %v\n%s", uri, resp.Status, err, b)
	}
	return b
}

// secret key makes the sealing key pair replicas share, 0600, and
// prints its public half; run again it keeps the pair and prints the
// same; a --dir that cannot be one is named in the error.
func TestSecretKey(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runner-key")
	first := runCLI(t, nil, "secret", "key", "--dir", dir)
	if first.code != 0 || !strings.Contains(first.stderr, "made ") {
		t.Fatalf("first: exit %d, stderr %q", first.code, first.stderr)
	}
	name := filepath.Join(dir, state.KeyFile)
	fi, err := os.Stat(name)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi, err)
	}
	before, _ := os.ReadFile(name)
	kp, created, err := state.LoadKey(dir)
	if err != nil || created || strings.TrimSpace(first.stdout) != kp.PublicString() {
		t.Fatalf("printed %q; the file's public half %q (created %v, %v)", first.stdout, kp.PublicString(), created, err)
	}
	again := runCLI(t, nil, "secret", "key", "--dir", dir)
	after, _ := os.ReadFile(name)
	if again.code != 0 || again.stdout != first.stdout || !strings.Contains(again.stderr, "kept") || string(after) != string(before) {
		t.Errorf("again: exit %d, stdout %q (first %q), stderr %q, file changed %v", again.code, again.stdout, first.stdout, again.stderr, string(after) != string(before))
	}
	bad := runCLI(t, nil, "secret", "key", "--dir", filepath.Join(name, "x"))
	if bad.code == 0 || !strings.Contains(bad.stderr, "--dir") {
		t.Errorf("a --dir under a file: exit %d, stderr %q; want an error naming --dir", bad.code, bad.stderr)
	}
}
