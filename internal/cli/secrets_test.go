package cli

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/parts/scheduler"
)

const repoA = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello"

// TestParseOperatorSecrets: the scoped form with values and files, the
// older name-to-value form read as unscoped, and what is refused.
func TestParseOperatorSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "secrets")
	got, err := parseOperatorSecrets(name, []byte(`{"secrets": [
		{"name": "A", "value": "a", "repos": ["`+repoA+`"], "workflows": ["deploy"], "refs": ["refs/heads/main"]},
		{"name": "B", "file": "token", "repos": ["*"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []scheduler.OperatorSecret{
		{Name: "A", Value: "a", Repos: []string{repoA}, Workflows: []string{"deploy"}, Refs: []string{"refs/heads/main"}},
		{Name: "B", Value: "from-file", Repos: []string{"*"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("scoped form (-want +got):\n%s", diff)
	}

	got, err = parseOperatorSecrets(name, []byte(`{"secrets": "old-style value"}`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]scheduler.OperatorSecret{{Name: "secrets", Value: "old-style value", Repos: []string{"*"}}}, got); diff != "" {
		t.Errorf("older form (-want +got):\n%s", diff)
	}

	for _, c := range []struct{ name, body, want string }{
		{"no repos", `{"secrets": [{"name": "A", "value": "a"}]}`, `no "repos"`},
		{"repo by handle", `{"secrets": [{"name": "A", "value": "a", "repos": ["at://alice.test/dev.knotless.repo/hello"]}]}`, "want at://DID"},
		{"repo of another collection", `{"secrets": [{"name": "A", "value": "a", "repos": ["at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.pull/x"]}]}`, "want at://DID"},
		{"star among others", `{"secrets": [{"name": "A", "value": "a", "repos": ["*", "` + repoA + `"]}]}`, "stands alone"},
		{"value and file", `{"secrets": [{"name": "A", "value": "a", "file": "token", "repos": ["*"]}]}`, "exactly one"},
		{"neither", `{"secrets": [{"name": "A", "repos": ["*"]}]}`, "exactly one"},
		{"short ref", `{"secrets": [{"name": "A", "value": "a", "repos": ["*"], "refs": ["main"]}]}`, "full ref name"},
		{"unknown field", `{"secrets": [{"name": "A", "value": "a", "repos": ["*"], "repo": "x"}]}`, "unknown field"},
		{"other keys beside secrets", `{"secrets": [], "TOKEN": "x"}`, "unknown field"},
		{"mixed older form", `{"TOKEN": "x", "N": 3}`, "N is not a string"},
		{"missing file", `{"secrets": [{"name": "A", "file": "nope", "repos": ["*"]}]}`, "nope"},
	} {
		if _, err := parseOperatorSecrets(name, []byte(c.body)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestServeRefusesUnscopedSecretsWithDiscover: with --discover, an
// operator secret for every repository (the older form included) stops
// the start, naming the flag, the file and the secret.
func TestServeRefusesUnscopedSecretsWithDiscover(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, body := range []string{
		`{"TOKEN": "x"}`,
		`{"secrets": [{"name": "TOKEN", "value": "x", "repos": ["*"]}]}`,
	} {
		file := filepath.Join(dir, "secrets")
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		// The shell override gets past the shell refusal to the secrets check.
		c := ServeCmd{DID: "did:plc:7u2ld3ffgzqvezmv6wxgxiix", Discover: true, SecretsFile: file, ExecutorFlags: ExecutorFlags{Executor: "shell"}, UnsafeShellUntrusted: true}
		env := &Env{Getenv: func(string) string { return "" }, Logger: slog.New(slog.DiscardHandler)}
		err := c.serve(context.Background(), env, env.Logger)
		if err == nil || !strings.Contains(err.Error(), "--discover") || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "TOKEN") {
			t.Errorf("%s: got %v, want a refusal naming --discover, %s and TOKEN", body, err, file)
		}
	}
}
