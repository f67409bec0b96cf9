package mirror

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// A repository record's source is the owner's to write, so the merge
// queue's push must never offer the lander's credential to a place the
// operator did not name: each credential is bound to a host (and
// optionally a path prefix), the push picks the one bound to its URL
// before git runs, and git is told to give it to that host only.

// ErrNoCredential is returned by Push when credentials are configured but
// none is bound to the push's URL: nothing is offered and nothing is
// pushed.
var ErrNoCredential = errors.New("no push credential is bound to this source")

// PushCredential is one credential of the lander's push and where it may
// be offered, written [SCHEME://]HOST[:PORT][/PATH]=FILE
// (--push-credential). The file holds an SSH private key (offered only
// to ssh URLs of Host) or an HTTPS token, TOKEN or USER:TOKEN on its
// first line (offered only to https URLs of Host, or http ones when the
// binding says http://).
type PushCredential struct {
	// Scheme is "" (https for a token, ssh for a key) or the one named:
	// "https", "ssh", or "http" (plaintext: only when named).
	Scheme string
	// Host is the host name (lower case) and Port the port, "" for the
	// scheme's default.
	Host, Port string
	// Path is a path prefix in whole segments: "org" binds org/… but
	// not organisation/…; "" binds every path on the host.
	Path string
	// File is the secret's file. Its content is never in an argv, an
	// environment, a log or a file git writes: ssh reads the key from
	// the path, a credential helper reads the token when git asks.
	File string
	// SSH says the file is an SSH private key (else a token), as read at
	// LoadPushCredential.
	SSH bool
}

var (
	hostRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)
	portRE    = regexp.MustCompile(`^[0-9]{1,5}$`)
	segmentRE = regexp.MustCompile(`^[A-Za-z0-9._~@+-]+$`)
	// urlHostRE is a URL's host[:port] as it may appear in git's
	// configuration and the credential helper's script.
	urlHostRE = regexp.MustCompile(`^[A-Za-z0-9.-]+(:[0-9]{1,5})?$`)
)

// credentialUsage is what a --push-credential looks like, for errors.
const credentialUsage = "write --push-credential HOST=FILE or HOST/PATH=FILE (e.g. git.example.org/your-org=/run/secrets/push-token): " +
	"the credential is offered to that host (and path prefix) only"

// LoadPushCredential parses spec ([SCHEME://]HOST[:PORT][/PATH]=FILE)
// and reads the file once to learn whether it is an SSH key or a token
// (the value is not kept). A spec without a host is refused: a
// credential bound to nothing would go wherever a repository record's
// source points.
func LoadPushCredential(spec string) (PushCredential, error) {
	refuse := func(format string, args ...any) (PushCredential, error) {
		return PushCredential{}, fmt.Errorf("--push-credential %q: %s", spec, fmt.Sprintf(format, args...))
	}
	binding, file, ok := strings.Cut(spec, "=")
	if !ok || binding == "" {
		return refuse("names no host it is for; %s", credentialUsage)
	}
	var c PushCredential
	if s, rest, ok := strings.Cut(binding, "://"); ok {
		switch strings.ToLower(s) {
		case "https", "http", "ssh":
			c.Scheme, binding = strings.ToLower(s), rest
		default:
			return refuse("scheme %q: want https://, http:// or ssh:// (or none)", s)
		}
	}
	hostport, path, _ := strings.Cut(binding, "/")
	host, port := hostport, ""
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		host, port = hostport[:i], hostport[i+1:]
		if !portRE.MatchString(port) {
			return refuse("port %q is not a number", port)
		}
	}
	c.Host, c.Port = strings.ToLower(host), port
	if !hostRE.MatchString(c.Host) {
		return refuse("host %q: want a host name such as git.example.org; %s", host, credentialUsage)
	}
	c.Path = strings.Trim(path, "/")
	if c.Path != "" {
		if why := checkPath(c.Path); why != "" {
			return refuse("path %q: %s", c.Path, why)
		}
	}
	if file == "" {
		return refuse("names no file; %s", credentialUsage)
	}
	if strings.ContainsAny(file, "'\n\\\" ") {
		return refuse("the file's path may not hold quotes, spaces or backslashes")
	}
	c.File = file
	ssh, err := c.kind()
	if err != nil {
		return PushCredential{}, fmt.Errorf("--push-credential %q: %w", spec, err)
	}
	c.SSH = ssh
	switch {
	case c.SSH && (c.Scheme == "https" || c.Scheme == "http"):
		return refuse("%s is an SSH private key, offered over ssh only; bind it as ssh://%s or without a scheme", file, hostport)
	case !c.SSH && c.Scheme == "ssh":
		return refuse("%s is a token, offered over https only; bind it as https://%s or without a scheme", file, hostport)
	}
	return c, nil
}

// kind reads the file: an SSH private key, or a token on its first line.
func (c PushCredential) kind() (ssh bool, err error) {
	data, err := os.ReadFile(c.File)
	if err != nil {
		return false, fmt.Errorf("read the push credential: %w", err)
	}
	s := strings.TrimSpace(string(data))
	if strings.HasPrefix(s, "-----BEGIN") {
		return true, nil
	}
	if first, _, _ := strings.Cut(s, "\n"); strings.TrimSpace(first) == "" {
		return false, fmt.Errorf("push credential %s: empty; want an SSH private key or TOKEN or USER:TOKEN on its first line", c.File)
	}
	return false, nil
}

// String is the binding as written, without the file.
func (c PushCredential) String() string {
	var b strings.Builder
	if c.Scheme != "" {
		b.WriteString(c.Scheme + "://")
	}
	b.WriteString(c.Host)
	if c.Port != "" {
		b.WriteString(":" + c.Port)
	}
	if c.Path != "" {
		b.WriteString("/" + c.Path)
	}
	return b.String()
}

// checkPath says why a path (without leading or trailing slashes) cannot
// be matched segment by segment against a binding, or "".
func checkPath(p string) string {
	for _, s := range strings.Split(p, "/") {
		switch {
		case s == "":
			return "contains //"
		case s == "." || s == "..":
			return "contains a . or .. segment"
		case !segmentRE.MatchString(s):
			return fmt.Sprintf("segment %q holds a character other than letters, digits and . _ ~ @ + -", s)
		}
	}
	return ""
}

// PushCredentials are the lander's credentials (--push-credential,
// repeated).
type PushCredentials []PushCredential

// pushTarget is where a push goes, as a binding is matched against it.
type pushTarget struct {
	scheme string // https, http or ssh
	host   string // lower case
	port   string // "" for the scheme's default
	path   string // without leading or trailing slashes
	// urlHost is host[:port] as the URL writes it: what git names in its
	// credential request.
	urlHost string
}

var defaultPorts = map[string]string{"https": "443", "http": "80", "ssh": "22"}

// target reads src's URL as a push target; ok is false for a local
// source (git asks no credential for it).
func target(src Source) (pushTarget, bool, error) {
	refuse := func(why string) (pushTarget, bool, error) {
		return pushTarget{}, true, fmt.Errorf("%w: %q: %s, so no credential binding can be matched to it", ErrNoCredential, src.URL, why)
	}
	var t pushTarget
	switch src.Protocol {
	case "file":
		return pushTarget{}, false, nil
	case "https", "http":
		u, err := url.Parse(src.URL)
		if err != nil {
			return refuse("not a URL")
		}
		if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
			return refuse("it has a query or a fragment")
		}
		t = pushTarget{scheme: src.Protocol, host: u.Hostname(), port: u.Port(), path: u.EscapedPath(), urlHost: u.Host}
	case "ssh":
		scheme, _, isURL := strings.Cut(src.URL, "://")
		if isURL && transportRE.MatchString(scheme) {
			u, err := url.Parse(src.URL)
			if err != nil {
				return refuse("not a URL")
			}
			t = pushTarget{host: u.Hostname(), port: u.Port(), path: u.EscapedPath(), urlHost: u.Host}
		} else {
			// scp-like [user@]host:path
			hostpart, path, _ := strings.Cut(src.URL, ":")
			if i := strings.LastIndexByte(hostpart, '@'); i >= 0 {
				hostpart = hostpart[i+1:]
			}
			t = pushTarget{host: hostpart, path: path, urlHost: hostpart}
		}
		t.scheme = "ssh"
	default:
		return refuse("its transport takes no credential")
	}
	t.host = strings.ToLower(t.host)
	if t.port == defaultPorts[t.scheme] {
		t.port = ""
	}
	if strings.Contains(t.path, "%") || strings.Contains(t.path, "\\") {
		return refuse("its path is escaped")
	}
	t.path = strings.Trim(t.path, "/")
	if t.path != "" {
		if why := checkPath(t.path); why != "" {
			return refuse("its path " + why)
		}
	}
	return t, true, nil
}

// matches reports whether c may be offered to t.
func (c PushCredential) matches(t pushTarget) bool {
	scheme := "https"
	switch {
	case c.SSH:
		scheme = "ssh"
	case c.Scheme == "http":
		scheme = "http"
	}
	if t.scheme != scheme {
		return false
	}
	port := c.Port
	if port == defaultPorts[t.scheme] {
		port = ""
	}
	if c.Host != t.host || port != t.port {
		return false
	}
	return c.Path == "" || t.path == c.Path || strings.HasPrefix(t.path, c.Path+"/")
}

// For picks the credential bound to src: the one with the longest path
// prefix among those whose scheme, host and port are src's. None
// configured, or a local source: no credential and no error. Some
// configured but none bound to src: an error wrapping ErrNoCredential
// that names the bindings.
func (cs PushCredentials) For(src Source) (*PushCredential, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	t, network, err := target(src)
	if err != nil || !network {
		return nil, err
	}
	var best *PushCredential
	for i := range cs {
		if cs[i].matches(t) && (best == nil || len(cs[i].Path) > len(best.Path)) {
			best = &cs[i]
		}
	}
	if best == nil {
		bound := make([]string, len(cs))
		for i, c := range cs {
			bound[i] = c.String()
		}
		where := t.host
		if t.port != "" {
			where += ":" + t.port
		}
		if t.path != "" {
			where += "/" + t.path
		}
		hint := fmt.Sprintf("No --push-credential can name its host %q.", t.host)
		if b, ok := t.binding(); ok {
			file := "TOKEN or USER:TOKEN on its first line"
			if t.scheme == "ssh" {
				file = "an SSH private key"
			}
			hint = fmt.Sprintf("If the lander may push there, add --push-credential %s=FILE (FILE: %s)", b, file)
		}
		return nil, fmt.Errorf("%w: %s %s (--push-credential binds %s); nothing is offered to it. %s",
			ErrNoCredential, t.scheme, where, strings.Join(bound, ", "), hint)
	}
	return best, nil
}

// binding is the --push-credential binding (without =FILE) that is
// offered to t and to nothing outside t's path, as LoadPushCredential
// reads it: its scheme named (without one a token is for https and a
// key for ssh, and http only ever when named), its port when it is not
// the scheme's default. ok is false when no binding can name t's host
// (an IPv6 address, a name with an underscore).
func (t pushTarget) binding() (b string, ok bool) {
	if !hostRE.MatchString(t.host) || t.port != "" && !portRE.MatchString(t.port) {
		return "", false
	}
	b = t.scheme + "://" + t.host
	if t.port != "" {
		b += ":" + t.port
	}
	if t.path != "" {
		b += "/" + t.path
	}
	return b, true
}

// gitAuth returns the environment and configuration that let git (and
// its ssh) use c for t, and for nothing else.
func (c PushCredential) gitAuth(t pushTarget) ([]string, [][2]string, error) {
	ssh, err := c.kind()
	if err != nil {
		return nil, nil, fmt.Errorf("--push-credential %s=%s: %w", c, c.File, err)
	}
	if ssh != c.SSH {
		return nil, nil, fmt.Errorf("--push-credential %s=%s: the file changed kind since the start (SSH key or token); restart the runner", c, c.File)
	}
	if !urlHostRE.MatchString(t.urlHost) {
		return nil, nil, fmt.Errorf("%w: host %q", ErrNoCredential, t.urlHost)
	}
	if c.SSH {
		return []string{"GIT_SSH_COMMAND=ssh -o BatchMode=yes -o IdentityAgent=none -o IdentitiesOnly=yes -i '" + c.File + "'"}, nil, nil
	}
	// The helper answers git's "get" with the file's first line as
	// USER:TOKEN (user "token" when there is no colon), and only when git
	// asks for the protocol and host the credential was picked for.
	// git consults it for that scheme://host alone, and follows no
	// redirect (one would move the push, and the credential, elsewhere).
	helper := `!f() { test "$1" = get || exit 0; p=; h=; while IFS= read -r l && test -n "$l"; do ` +
		`case "$l" in protocol=*) p=${l#protocol=};; host=*) h=${l#host=};; esac; done; ` +
		`test "$p" = '` + t.scheme + `' && test "$h" = '` + t.urlHost + `' || exit 0; ` +
		`IFS= read -r l < '` + c.File + `' || test -n "$l"; ` +
		`case "$l" in *:*) u=${l%%:*}; p=${l#*:};; *) u=token; p=$l;; esac; ` +
		`printf 'username=%s\npassword=%s\n' "$u" "$p"; }; f`
	return nil, [][2]string{
		{"credential." + t.scheme + "://" + t.urlHost + ".helper", helper},
		{"http.followRedirects", "false"},
	}, nil
}
