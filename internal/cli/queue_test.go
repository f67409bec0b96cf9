package cli

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/mirror"
)

// TestPushCredentials: --push-credential binds each credential to a host
// (and path prefix); one bound to nothing (the older FILE form, or a
// $CREDENTIALS_DIRECTORY/push-credential) stops the start, saying what
// to write.
func TestPushCredentials(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("bot:s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty, withOld := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(withOld, "push-credential"), []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(dir string) *Env {
		return &Env{Getenv: func(k string) string {
			if k == "CREDENTIALS_DIRECTORY" {
				return dir
			}
			return ""
		}}
	}
	for _, c := range []struct {
		name    string
		flags   []string
		credDir string
		want    mirror.PushCredentials
		err     []string
	}{
		{name: "none", credDir: empty},
		{name: "bound to hosts and a path", flags: []string{"git.example.org/org=" + token, "Other.example.org:8443=" + token},
			want: mirror.PushCredentials{{Host: "git.example.org", Path: "org", File: token}, {Host: "other.example.org", Port: "8443", File: token}}},
		{name: "the older form, a file alone", flags: []string{token},
			err: []string{"--push-credential", token, "names no host", "--push-credential HOST=FILE or HOST/PATH=FILE"}},
		{name: "a binding naming no file", flags: []string{"git.example.org/org="}, err: []string{"--push-credential", "names no file"}},
		{name: "a missing file", flags: []string{"git.example.org=" + filepath.Join(dir, "missing")}, err: []string{"--push-credential", "missing"}},
		{name: "the older default in the credentials directory", flags: []string{"git.example.org=" + token}, credDir: withOld,
			err: []string{filepath.Join(withOld, "push-credential"), "bound to no host", "--push-credential HOST=FILE", "pushCredentials"}},
	} {
		got, err := (&ServeCmd{PushCredentials: c.flags}).pushCredentials(env(c.credDir))
		if c.err != nil {
			for _, want := range c.err {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: error %v, want one with %q", c.name, err, want)
				}
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, diff)
		}
	}
}

// TestServeRefusesUnboundPushCredential: serve --queue with a push
// credential bound to no host does not start.
func TestServeRefusesUnboundPushCredential(t *testing.T) {
	t.Parallel()
	token := filepath.Join(t.TempDir(), "push-token")
	if err := os.WriteFile(token, []byte("s3cr3t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, _, err := parseServe(t, "--did", "did:plc:7u2ld3ffgzqvezmv6wxgxiix", "--queue", "--push-credential", token,
		"--executor", "shell", "--unsafe-shell-untrusted", "--state-dir", t.TempDir(), "--cache-dir", t.TempDir(), "--", "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello")
	if err != nil {
		t.Fatal(err)
	}
	env := &Env{Getenv: func(string) string { return "" }, Logger: slog.New(slog.DiscardHandler)}
	err = root.Serve.serve(context.Background(), env, env.Logger)
	if err == nil || !strings.Contains(err.Error(), "--push-credential") || !strings.Contains(err.Error(), "names no host") {
		t.Errorf("serve: %v; want a refusal naming --push-credential", err)
	}
}

// TestPushCredentialFlagRepeats: each --push-credential is one binding,
// commas included, on the command line and in --config.
func TestPushCredentialFlagRepeats(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"push-credential": ["a.example.org=/run/a,b", "b.example.org/x=/run/b"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	root, _, err := parseServe(t, "--push-credential", "a.example.org=/run/a,b", "--push-credential", "b.example.org/x=/run/b")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.example.org=/run/a,b", "b.example.org/x=/run/b"}
	if diff := cmp.Diff(want, root.Serve.PushCredentials); diff != "" {
		t.Errorf("flags (-want +got):\n%s", diff)
	}
	root, _, err = parseServe(t, "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, root.Serve.PushCredentials); diff != "" {
		t.Errorf("--config (-want +got):\n%s", diff)
	}
}
