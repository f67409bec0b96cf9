package mirror

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckSource: https always; ssh for a repository's own source
// only; http and local paths only when the operator allows them, and a
// local path never inside the runner's own directories; every other
// transport never. A refusal wraps ErrRefused and names the flag.
func TestCheckSource(t *testing.T) {
	t.Parallel()
	none := Policy{Forbidden: []string{"/var/cache/knotless"}}
	local := Policy{AllowLocal: true, Forbidden: []string{"/var/cache/knotless", "/var/lib/knotless"}}
	http := Policy{AllowHTTP: true}
	for _, tc := range []struct {
		source string
		origin Origin
		policy Policy
		want   string // the protocol, or a piece of the refusal
	}{
		{"https://git.example.com/a/b.git", Owner, none, "https"},
		{"https://git.example.com/a/b.git", Pull, none, "https"},
		{"HTTPS://git.example.com/a", Pull, none, "https"},
		{"https://[::1]:8443/a", Pull, none, "https"},
		{"https:///no-host", Pull, none, "not a URL with a host"},
		{"https://-oProxyCommand=x/a", Owner, none, "not a URL with a host"},
		{"http://git.example.com/a", Owner, none, "--allow-http-sources"},
		{"http://git.example.com/a", Pull, none, "--allow-http-sources"},
		{"http://127.0.0.1:1/a", Pull, http, "http"},
		{"ssh://git@git.example.com/a.git", Owner, none, "ssh"},
		{"git@git.example.com:a/b.git", Owner, none, "ssh"},
		{"git+ssh://git.example.com/a", Owner, none, "ssh"},
		{"ssh://git@git.example.com/a.git", Pull, local, "a pull's head.source must be https"},
		{"git@git.example.com:a/b.git", Pull, local, "a pull's head.source must be https"},
		{"ssh://-oProxyCommand=x/a", Owner, none, "not an ssh host"},
		{"-oProxyCommand=x:a", Owner, none, "option"},
		{"--upload-pack=touch /tmp/x", Owner, local, "option"},
		{"file:///srv/git/a.git", Owner, none, "--allow-local-sources"},
		{"/srv/git/a.git", Owner, none, "--allow-local-sources"},
		{"/var/cache/knotless/mirrors/x.git", Pull, none, "--allow-local-sources"},
		{"file:///srv/git/a.git", Owner, local, "file"},
		{"/srv/git/a.git", Pull, local, "file"},
		{"relative/a.git", Owner, local, "absolute path"},
		{"file://otherhost/srv/a.git", Owner, local, "not a local file:// URL"},
		{"/var/cache/knotless/mirrors/0a1b.git", Pull, local, "inside the runner's own directory /var/cache/knotless"},
		{"file:///var/cache/knotless/mirrors/0a1b.git", Pull, local, "inside the runner's own directory"},
		{"/srv/../var/lib/knotless/state.json", Owner, local, "inside the runner's own directory /var/lib/knotless"},
		{"/var/cache/knotless-other/a.git", Owner, local, "file"},
		{"ext::sh -c touch% /tmp/pwned", Owner, local, "space"},
		{"ext::sh%20-c%20id", Owner, local, "remote helper transports (ext::)"},
		{"fd::17", Owner, local, "remote helper transports"},
		{"git://git.example.com/a.git", Owner, local, "git:// transport is never allowed"},
		{"ftp://git.example.com/a.git", Owner, local, "never allowed"},
		{"", Owner, local, "empty"},
		{"https://git.example.com/a\n.git", Pull, none, "control character"},
	} {
		got, err := CheckSource(tc.source, tc.origin, tc.policy)
		if err != nil {
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckSource(%q, %s): %v, want %q", tc.source, tc.origin, err, tc.want)
			}
			continue
		}
		if got.Protocol != tc.want {
			t.Errorf("CheckSource(%q, %s) allowed as %q, want %q", tc.source, tc.origin, got.Protocol, tc.want)
		}
	}
}

// TestCheckRef: git check-ref-format's rules, a required prefix, and no
// refspec syntax (a record's ref must never write a ref).
func TestCheckRef(t *testing.T) {
	t.Parallel()
	push := []string{"refs/heads/", "refs/tags/"}
	for _, tc := range []struct {
		ref  string
		want string // "" when valid
	}{
		{"refs/heads/main", ""},
		{"refs/heads/feature/x-1.2", ""},
		{"refs/tags/v1.0.0", ""},
		{"refs/heads/ünïcode", ""},
		{"refs/heads/main:refs/heads/evil", "':'"},
		{"+refs/heads/main", "must start with"},
		{"refs/heads/a+b", "'+'"},
		{"refs/heads/*", "'*'"},
		{"refs/heads/a..b", "contains .."},
		{"-refs/heads/main", "must start with"},
		{"--upload-pack=x", "must start with"},
		{"refs/remotes/origin/main", "must start with"},
		{"refs/heads/", "must start with"},
		{"main", "must start with"},
		{"refs/heads/a//b", "//"},
		{"refs/heads/a/", "ends with /"},
		{"refs/heads/.hidden", "begins with ."},
		{"refs/heads/x.lock", ".lock"},
		{"refs/heads/x.", "ends with ."},
		{"refs/heads/a@{1}", "@{"},
		{"refs/heads/a b", "' '"},
		{"refs/heads/a~1", "'~'"},
		{"refs/heads/a^", "'^'"},
		{"refs/heads/a?", "'?'"},
		{"refs/heads/[a]", "'['"},
		{"refs/heads/a\\b", "'\\\\'"},
		{"refs/heads/a\x01", "control character"},
		{"refs/heads/" + strings.Repeat("a", 1100), "longer than"},
	} {
		err := CheckRef(tc.ref, push...)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckRef(%q): %v, want valid", tc.ref, err)
		case tc.want != "" && (err == nil || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckRef(%q): %v, want a refusal with %q", tc.ref, err, tc.want)
		}
	}
	if err := CheckRef("refs/tags/v1", "refs/heads/"); err == nil {
		t.Error("a pull's head ref may be a tag")
	}
}

// TestCheckRefAgreesWithGit: every ref CheckRef accepts, git accepts.
func TestCheckRefAgreesWithGit(t *testing.T) {
	t.Parallel()
	for _, ref := range []string{"refs/heads/main", "refs/heads/a.b/c", "refs/heads/a..b", "refs/heads/a.lock", "refs/heads/.x", "refs/heads/a@{b", "refs/heads/a//b", "refs/heads/x.", "refs/heads/ünï", "refs/heads/a\x7f"} {
		ours := CheckRef(ref, "refs/heads/") == nil
		theirs := gitCheckRefFormat(t, ref)
		if ours && !theirs {
			t.Errorf("%q: CheckRef accepts what git check-ref-format refuses", ref)
		}
	}
}

func TestValidCommit(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		strings.Repeat("a", 40): true, strings.Repeat("0", 64): true,
		strings.Repeat("A", 40): false, strings.Repeat("a", 39): false, strings.Repeat("a", 41): false,
		"--upload-pack=x": false, "HEAD": false, "main": false, strings.Repeat("a", 40) + "^{tree}": false,
	} {
		if got := ValidCommit(s); got != want {
			t.Errorf("ValidCommit(%q) = %v, want %v", s, got, want)
		}
	}
}
