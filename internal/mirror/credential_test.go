package mirror

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/tests/gitrepo"
)

// credentialFiles writes a token file and an SSH key file.
func credentialFiles(t *testing.T) (token, key string) {
	t.Helper()
	dir := t.TempDir()
	token, key = filepath.Join(dir, "token"), filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(token, []byte("lander:s3cr3t-push-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return token, key
}

func TestLoadPushCredential(t *testing.T) {
	t.Parallel()
	token, key := credentialFiles(t)
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec string
		want PushCredential
		err  string
	}{
		{spec: "git.example.org=" + token, want: PushCredential{Host: "git.example.org", File: token}},
		{spec: "Git.Example.org:8443/org/repo.git/=" + token, want: PushCredential{Host: "git.example.org", Port: "8443", Path: "org/repo.git", File: token}},
		{spec: "http://127.0.0.1:8080=" + token, want: PushCredential{Scheme: "http", Host: "127.0.0.1", Port: "8080", File: token}},
		{spec: "git.example.org/org=" + key, want: PushCredential{Host: "git.example.org", Path: "org", File: key, SSH: true}},
		{spec: "ssh://git.example.org:2222=" + key, want: PushCredential{Scheme: "ssh", Host: "git.example.org", Port: "2222", File: key, SSH: true}},
		{spec: token, err: "names no host"},
		{spec: "=" + token, err: "names no host"},
		{spec: "/srv/git=" + token, err: "want a host name"},
		{spec: "git.example.org=", err: "names no file"},
		{spec: "git.example.org:port=" + token, err: "not a number"},
		{spec: "ftp://git.example.org=" + token, err: "want https://, http:// or ssh://"},
		{spec: "git.example.org/org/../other=" + token, err: ". or .. segment"},
		{spec: "git.example.org/org//x=" + token, err: "contains //"},
		{spec: "git.example.org/o%2e=" + token, err: "holds a character"},
		{spec: "git.example.org=" + filepath.Join(t.TempDir(), "it's"), err: "quotes"},
		{spec: "git.example.org=" + filepath.Join(t.TempDir(), "missing"), err: "no such file"},
		{spec: "git.example.org=" + empty, err: "empty"},
		{spec: "https://git.example.org=" + key, err: "SSH private key, offered over ssh only"},
		{spec: "ssh://git.example.org=" + token, err: "is a token, offered over https only"},
	} {
		got, err := LoadPushCredential(c.spec)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "--push-credential") {
				t.Errorf("%s: %+v, %v; want an error naming --push-credential with %q", c.spec, got, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.spec, err)
			continue
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.spec, diff)
		}
	}
}

// For offers a credential only to the scheme, host, port and path
// prefix it is bound to; anything else gets none, with an error naming
// the bindings.
func TestPushCredentialsFor(t *testing.T) {
	t.Parallel()
	token, key := credentialFiles(t)
	load := func(spec string) PushCredential {
		c, err := LoadPushCredential(spec)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	host := load("git.example.org=" + token)
	org := load("git.example.org/org=" + token)
	repo := load("git.example.org/org/repo.git=" + token)
	plain := load("http://127.0.0.1:8080=" + token)
	sshKey := load("git.example.org=" + key)
	port := load("other.example.org:8443=" + token)
	all := PushCredentials{host, org, repo, plain, sshKey, port}
	for _, c := range []struct {
		name   string
		creds  PushCredentials
		source string
		want   *PushCredential
		err    string
	}{
		{"listed host", all, "https://git.example.org/someone/x.git", &host, ""},
		{"default port written out", all, "https://git.example.org:443/someone/x.git", &host, ""},
		{"host case", all, "https://GIT.example.org/someone/x.git", &host, ""},
		{"longest prefix", all, "https://git.example.org/org/y.git", &org, ""},
		{"exact repository", all, "https://git.example.org/org/repo.git", &repo, ""},
		{"prefix is whole segments", PushCredentials{org}, "https://git.example.org/organisation/y.git", nil, "no push credential is bound"},
		{"prefix is whole segments, same name", PushCredentials{repo}, "https://git.example.org/org/repo.gitx", nil, "no push credential is bound"},
		{"dot-dot out of the prefix", PushCredentials{org}, "https://git.example.org/org/../victim/x.git", nil, "segment"},
		{"escaped dot-dot", PushCredentials{org}, "https://git.example.org/org/%2e%2e/victim/x.git", nil, "escaped"},
		{"query", all, "https://git.example.org/org/x.git?a=b", nil, "query"},
		{"unlisted host", all, "https://evil.example/org/x.git", nil, "https evil.example/org/x.git (--push-credential binds git.example.org, git.example.org/org, git.example.org/org/repo.git, http://127.0.0.1:8080, git.example.org, other.example.org:8443)"},
		{"listed host, other port", all, "https://git.example.org:8443/x.git", nil, "no push credential is bound"},
		{"bound port", all, "https://other.example.org:8443/x.git", &port, ""},
		{"bound port, default port", all, "https://other.example.org/x.git", nil, "no push credential is bound"},
		{"subdomain of a listed host", all, "https://evil.git.example.org/x.git", nil, "no push credential is bound"},
		{"a token is not sent over plaintext unless bound so", PushCredentials{host}, "http://git.example.org/x.git", nil, "no push credential is bound"},
		{"plaintext when bound so", all, "http://127.0.0.1:8080/x.git", &plain, ""},
		{"an http binding is not for https", PushCredentials{plain}, "https://127.0.0.1:8080/x.git", nil, "no push credential is bound"},
		{"ssh URL gets the key", all, "ssh://git@git.example.org/org/x.git", &sshKey, ""},
		{"scp-like ssh gets the key", all, "git@git.example.org:org/x.git", &sshKey, ""},
		{"ssh to a host with only a token", PushCredentials{host}, "ssh://git.example.org/x.git", nil, "no push credential is bound"},
		{"ssh to an unlisted host", all, "git@evil.example:x.git", nil, "no push credential is bound"},
		{"local source: none, no error", all, "file:///srv/x.git", nil, ""},
		{"no credentials: none, no error", nil, "https://evil.example/x.git", nil, ""},
	} {
		src, err := CheckSource(c.source, Owner, Policy{AllowHTTP: true, AllowLocal: true})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := c.creds.For(src)
		switch {
		case c.err != "":
			if err == nil || !errors.Is(err, ErrNoCredential) || !strings.Contains(err.Error(), c.err) || got != nil {
				t.Errorf("%s: %+v, %v; want none and an error with %q", c.name, got, err, c.err)
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want == nil && got != nil, c.want != nil && (got == nil || *got != *c.want):
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// httpOrigin is a bare repository with main at base, served over HTTP by
// a server that wants the lander's token for a push, and a mirror
// holding a commit on top of base.
type httpOrigin struct {
	origin, base, tip string
	r                 *Repo
	m                 *Mirrors
}

func newHTTPOrigin(t *testing.T) httpOrigin {
	t.Helper()
	ctx := context.Background()
	work := t.TempDir()
	gitIn(t, work, "init", "--quiet", "--initial-branch=main")
	var o httpOrigin
	o.base = commitFiles(t, work, map[string]string{"a.txt": "a\n"})
	o.tip = commitFiles(t, work, map[string]string{"b.txt": "b\n"})
	root := t.TempDir()
	o.origin = filepath.Join(root, "origin.git")
	gitIn(t, work, "init", "--quiet", "--bare", o.origin)
	gitIn(t, work, "push", "--quiet", o.origin, o.base+":refs/heads/main")
	var err error
	o.m, err = New(t.TempDir(), Options{Policy: Policy{AllowHTTP: true, AllowLocal: true}})
	if err != nil {
		t.Fatal(err)
	}
	if o.r, err = o.m.Open(ctx, "batch"); err != nil {
		t.Fatal(err)
	}
	if err := o.r.Fetch(ctx, Pull, "file://"+work, "refs/heads/main", o.tip); err != nil {
		t.Fatal(err)
	}
	return o
}

// noSecretUnder fails the test when a file under dir holds secret.
func noSecretUnder(t *testing.T, dir, secret string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), secret) {
			t.Errorf("%s holds the credential", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPushOffersTheCredentialOnlyWhereItIsBound: real git servers that
// record what they are offered. A push to a server the credential is
// not bound to (another port, another loopback host, or one a bound
// server redirects to) offers it nothing and fails naming
// --push-credential; the bound server gets it and takes the push. No
// file of the mirror, and no error, holds the token.
func TestPushOffersTheCredentialOnlyWhereItIsBound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	token, _ := credentialFiles(t)
	const secret = "s3cr3t-push-token"

	o := newHTTPOrigin(t)
	root := filepath.Dir(o.origin)
	listed := gitrepo.Serve(t, "", root)
	otherPort := gitrepo.Serve(t, "", root)
	otherHost := gitrepo.Serve(t, "127.0.0.2", root)
	redirecting := gitrepo.Serve(t, "", root)
	redirecting.RedirectTo(otherPort.URL)
	cred, err := LoadPushCredential(listed.URL + "/origin.git=" + token)
	if err != nil {
		t.Fatal(err)
	}
	redirectCred, err := LoadPushCredential(redirecting.URL + "=" + token)
	if err != nil {
		t.Fatal(err)
	}
	creds := PushCredentials{cred, redirectCred}

	for _, c := range []struct {
		name   string
		srv    *gitrepo.Server
		source string
		err    string
	}{
		{"listed host, another port", otherPort, otherPort.URL + "/origin.git", "--push-credential binds"},
		{"another loopback host", otherHost, otherHost.URL + "/origin.git", "--push-credential binds"},
		{"listed host and port, another path", listed, listed.URL + "/other.git", "--push-credential binds"},
		{"a listed server redirecting elsewhere", redirecting, redirecting.URL + "/origin.git", "returned error: 302"},
	} {
		err := o.r.Push(ctx, c.source, "main", o.base, o.tip, creds)
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: push: %v; want a refusal with %q", c.name, err, c.err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error holds the credential: %v", c.name, err)
		}
	}
	for _, s := range []*gitrepo.Server{otherPort, otherHost, redirecting} {
		if got := s.Offered(); len(got) != 0 {
			t.Errorf("%s was offered %q", s.URL, got)
		}
	}
	if got := listed.Offered(); len(got) != 0 {
		t.Errorf("the listed server was offered %q for a path not bound", got)
	}
	if got := gitIn(t, o.origin, "rev-parse", "refs/heads/main"); got != o.base {
		t.Fatalf("origin main moved to %s before the bound push", got)
	}

	if err := o.r.Push(ctx, listed.URL+"/origin.git", "main", o.base, o.tip, creds); err != nil {
		t.Fatalf("push to the bound server: %v", err)
	}
	if got := gitIn(t, o.origin, "rev-parse", "refs/heads/main"); got != o.tip {
		t.Errorf("origin main: %s, want %s", got, o.tip)
	}
	if got := listed.Offered(); len(got) == 0 || slices.ContainsFunc(got, func(s string) bool { return s != "lander:"+secret }) {
		t.Errorf("the bound server was offered %q; want the token only", got)
	}
	for _, s := range []*gitrepo.Server{otherPort, otherHost, redirecting} {
		if got := s.Offered(); len(got) != 0 {
			t.Errorf("%s was offered %q", s.URL, got)
		}
	}
	noSecretUnder(t, o.m.dir, secret)
}

// Without any credential, a push offers nothing: the server asks, git
// has no helper and no prompt, the push fails.
func TestPushWithoutCredentialOffersNothing(t *testing.T) {
	t.Parallel()
	o := newHTTPOrigin(t)
	srv := gitrepo.Serve(t, "", filepath.Dir(o.origin))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := o.r.Push(ctx, srv.URL+"/origin.git", "main", o.base, o.tip, nil); err == nil {
		t.Error("push without a credential to a server that wants one went through")
	}
	if got := srv.Offered(); len(got) != 0 {
		t.Errorf("offered %q", got)
	}
}

// An SSH key goes to ssh only for a host it is bound to: ssh here is a
// stand-in on PATH that records its arguments and fails.
func TestPushOffersTheSSHKeyOnlyToItsHost(t *testing.T) {
	bin := t.TempDir()
	calls := filepath.Join(t.TempDir(), "calls")
	if err := os.WriteFile(filepath.Join(bin, "ssh"), []byte("#!/bin/sh\necho \"$*\" >> '"+calls+"'\nexit 255\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	ctx := context.Background()
	_, key := credentialFiles(t)
	cred, err := LoadPushCredential("git.example.org=" + key)
	if err != nil {
		t.Fatal(err)
	}
	o := newHTTPOrigin(t)
	read := func() []string {
		b, _ := os.ReadFile(calls)
		_ = os.Remove(calls)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}

	err = o.r.Push(ctx, "git@evil.example:x.git", "main", o.base, o.tip, PushCredentials{cred})
	if !errors.Is(err, ErrNoCredential) {
		t.Errorf("push to an unlisted ssh host: %v, want ErrNoCredential", err)
	}
	if _, err := os.Stat(calls); err == nil {
		t.Errorf("ssh ran for an unlisted host: %q", read())
	}
	if err := o.r.Push(ctx, "git@git.example.org:x.git", "main", o.base, o.tip, PushCredentials{cred}); err == nil {
		t.Error("push through the failing ssh went through")
	}
	if got := read(); len(got) == 0 || !strings.Contains(got[0], "-i "+key) || !strings.Contains(got[0], "git.example.org") {
		t.Errorf("ssh to the bound host ran as %q; want it given the key", got)
	}
	if err := o.r.Push(ctx, "git@evil.example:x.git", "main", o.base, o.tip, nil); err == nil {
		t.Error("push through the failing ssh went through")
	}
	if got := read(); len(got) == 0 || strings.Contains(got[0], key) {
		t.Errorf("ssh without a credential ran as %q; want no key", got)
	}
}

// TestNoCredentialSuggestsABindingThatMatches: the binding the error of
// a source no credential is bound to suggests is read back by
// LoadPushCredential (with the kind of file it asks for) and is the one
// For then picks for that source.
func TestNoCredentialSuggestsABindingThatMatches(t *testing.T) {
	t.Parallel()
	token, key := credentialFiles(t)
	other, err := LoadPushCredential("other.example.org=" + token)
	if err != nil {
		t.Fatal(err)
	}
	suggested := regexp.MustCompile(`add --push-credential (\S+)=FILE`)
	for _, source := range []string{
		"https://git.example.org/org/x.git",
		"https://Git.Example.org:443/org/x.git",
		"https://git.example.org:8443/x.git",
		"https://git.example.org",
		"http://127.0.0.1:8080/x.git",
		"http://git.example.org/org/x.git",
		"ssh://git@git.example.org/org/x.git",
		"ssh://git@git.example.org:2222/org/x.git",
		"git@git.example.org:org/x.git",
		"git.example.org:x.git",
	} {
		src, err := CheckSource(source, Owner, Policy{AllowHTTP: true})
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		_, err = PushCredentials{other}.For(src)
		m := suggested.FindStringSubmatch(fmt.Sprint(err))
		if !errors.Is(err, ErrNoCredential) || m == nil {
			t.Errorf("%s: %v; want ErrNoCredential suggesting a binding", source, err)
			continue
		}
		file, kind := token, "(FILE: TOKEN or USER:TOKEN on its first line)"
		if src.Protocol == "ssh" {
			file, kind = key, "(FILE: an SSH private key)"
		}
		if !strings.Contains(err.Error(), kind) {
			t.Errorf("%s: %v; want it to say %q", source, err, kind)
		}
		c, err := LoadPushCredential(m[1] + "=" + file)
		if err != nil {
			t.Errorf("%s: the suggested binding %s: %v", source, m[1], err)
			continue
		}
		got, err := PushCredentials{other, c}.For(src)
		if err != nil || got == nil || *got != c {
			t.Errorf("%s: the suggested binding %s is not picked: %+v, %v", source, m[1], got, err)
		}
	}

	// A host no binding can name: the error says so, and suggests none.
	src, err := CheckSource("https://[::1]:8443/x.git", Owner, Policy{AllowHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (PushCredentials{other}).For(src); !errors.Is(err, ErrNoCredential) || !strings.Contains(err.Error(), `No --push-credential can name its host "::1".`) || suggested.MatchString(err.Error()) {
		t.Errorf("an IPv6 host: %v", err)
	}
}
