package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPushCredential: --push-credential must name a file; without it the
// credential is $CREDENTIALS_DIRECTORY/push-credential when there is
// one, else none.
func TestPushCredential(t *testing.T) {
	t.Parallel()
	creds := t.TempDir()
	withFile := t.TempDir()
	if err := os.WriteFile(filepath.Join(withFile, "push-credential"), []byte("token\n"), 0o600); err != nil {
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
		name, flag, credDir, want, err string
	}{
		{name: "none", want: ""},
		{name: "credentials directory without one", credDir: creds, want: ""},
		{name: "from the credentials directory", credDir: withFile, want: filepath.Join(withFile, "push-credential")},
		{name: "flag", flag: filepath.Join(withFile, "push-credential"), credDir: creds, want: filepath.Join(withFile, "push-credential")},
		{name: "flag naming no file", flag: filepath.Join(creds, "missing"), err: "--push-credential"},
	} {
		got, err := (&ServeCmd{PushCredentialFile: c.flag}).pushCredential(env(c.credDir))
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one naming %s", c.name, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}
