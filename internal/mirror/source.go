package mirror

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
)

// ErrRefused wraps every source, ref or size the mirror refuses to
// use. Such an event cannot run until its record changes: the caller
// reports it (an error check) instead of trying again.
var ErrRefused = errors.New("refused")

// ErrNoBranch wraps a branch the source does not have (Branch): not a
// failure of the fetch, an answer of the source.
var ErrNoBranch = errors.New("no such branch")

// Origin says who named a source, which decides what it may be.
type Origin int

const (
	// Owner is the repository record's own source.
	Owner Origin = iota
	// Pull is a pull's head.source, named by whoever wrote the pull.
	Pull
)

func (o Origin) String() string {
	if o == Pull {
		return "pull head.source"
	}
	return "repository source"
}

// Policy is what the operator allows beyond https.
type Policy struct {
	// AllowLocal allows local paths and file:// URLs (--allow-local-sources):
	// for tests and single-tenant machines only.
	AllowLocal bool
	// AllowHTTP allows plaintext http:// (--allow-http-sources).
	AllowHTTP bool
	// Forbidden are directories no local source may be in, whatever
	// AllowLocal says: the runner's own state and cache (other tenants'
	// mirrors).
	Forbidden []string
}

// Source is a source the policy allows: Protocol is the one git
// transport a fetch from it may use (GIT_ALLOW_PROTOCOL).
type Source struct {
	URL      string
	Protocol string
	// Local is the path of a local source, else "".
	Local string
}

var transportRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// CheckSource decides whether a fetch may use source, named by origin:
// https always; ssh for the owner only; http and local paths (file://
// or a path) only when the policy allows them, never inside a forbidden
// directory; every other transport (ext::, fd::, git://, …) never. The
// error wraps ErrRefused and names the flag that would allow it.
func CheckSource(source string, origin Origin, p Policy) (Source, error) {
	refuse := func(format string, args ...any) (Source, error) {
		return Source{}, fmt.Errorf("%w: %s %q: %s", ErrRefused, origin, source, fmt.Sprintf(format, args...))
	}
	if source == "" {
		return refuse("empty")
	}
	if strings.HasPrefix(source, "-") {
		return refuse("git would read it as an option")
	}
	for _, r := range source {
		if r < 0x20 || r == 0x7f || r == ' ' {
			return refuse("contains a space or a control character")
		}
	}
	scheme, _, isURL := strings.Cut(source, "://")
	if !isURL || !transportRE.MatchString(scheme) {
		firstSlash := strings.IndexByte(source, '/')
		colon := strings.IndexByte(source, ':')
		switch {
		case strings.Contains(source, "::"):
			return refuse("remote helper transports (%s::) are never allowed", strings.SplitN(source, "::", 2)[0])
		case colon >= 0 && (firstSlash < 0 || colon < firstSlash):
			// scp-like user@host:path is ssh.
			host := source[:colon]
			if i := strings.LastIndexByte(host, '@'); i >= 0 {
				host = host[i+1:]
			}
			return checkSSH(source, host, origin, refuse)
		default:
			return checkLocal(source, source, p, refuse)
		}
	}
	switch strings.ToLower(scheme) {
	case "https":
		u, err := url.Parse(source)
		if err != nil || u.Host == "" || strings.HasPrefix(u.Host, "-") {
			return refuse("not a URL with a host")
		}
		return Source{URL: source, Protocol: "https"}, nil
	case "http":
		if !p.AllowHTTP {
			return refuse("plaintext http:// is refused (an operator allows it with --allow-http-sources); use https://")
		}
		u, err := url.Parse(source)
		if err != nil || u.Host == "" || strings.HasPrefix(u.Host, "-") {
			return refuse("not a URL with a host")
		}
		return Source{URL: source, Protocol: "http"}, nil
	case "ssh", "git+ssh", "ssh+git":
		u, err := url.Parse(source)
		if err != nil {
			return refuse("not a URL: %v", err)
		}
		return checkSSH(source, u.Hostname(), origin, refuse)
	case "file":
		u, err := url.Parse(source)
		if err != nil || (u.Host != "" && u.Host != "localhost") {
			return refuse("not a local file:// URL")
		}
		return checkLocal(source, u.Path, p, refuse)
	default:
		return refuse("the %s:// transport is never allowed (https, or ssh for a repository's own source)", scheme)
	}
}

func checkSSH(source, host string, origin Origin, refuse func(string, ...any) (Source, error)) (Source, error) {
	if origin != Owner {
		return refuse("ssh is allowed only for a repository's own source; a pull's head.source must be https")
	}
	if host == "" || strings.HasPrefix(host, "-") {
		return refuse("not an ssh host")
	}
	return Source{URL: source, Protocol: "ssh"}, nil
}

func checkLocal(source, path string, p Policy, refuse func(string, ...any) (Source, error)) (Source, error) {
	if !p.AllowLocal {
		return refuse("local paths and file:// are refused (an operator allows them with --allow-local-sources)")
	}
	if !filepath.IsAbs(path) {
		return refuse("a local source must be an absolute path")
	}
	clean := filepath.Clean(path)
	for _, dir := range p.Forbidden {
		if within(clean, dir) {
			return refuse("inside the runner's own directory %s (its mirrors and state belong to other repositories)", dir)
		}
	}
	return Source{URL: source, Protocol: "file", Local: clean}, nil
}

// within reports whether path is dir or under it.
func within(path, dir string) bool {
	dir = filepath.Clean(dir)
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

var objectRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// ValidCommit reports whether s is a full object id (40 or 64 lower
// case hex digits).
func ValidCommit(s string) bool { return objectRE.MatchString(s) }

// CheckRef refuses a ref that is not a well-formed ref under one of
// prefixes (git check-ref-format's rules, and no refspec syntax), so
// that it can go to git as a refspec that writes nothing.
func CheckRef(ref string, prefixes ...string) error {
	refuse := func(why string) error { return fmt.Errorf("%w: ref %q: %s", ErrRefused, ref, why) }
	under := false
	for _, p := range prefixes {
		if strings.HasPrefix(ref, p) && len(ref) > len(p) {
			under = true
		}
	}
	if !under {
		return refuse("must start with " + strings.Join(prefixes, " or "))
	}
	if len(ref) > 1024 {
		return refuse("longer than 1024 bytes")
	}
	if why := checkRefFormat(ref); why != "" {
		return refuse(why)
	}
	return nil
}

// checkRefFormat is git check-ref-format's rules (without
// --allow-onelevel or --refspec-pattern), plus '+' (a forced refspec),
// returning why ref breaks one, or "".
func checkRefFormat(ref string) string {
	switch {
	case ref == "@":
		return `is "@"`
	case strings.HasPrefix(ref, "/") || strings.HasSuffix(ref, "/"):
		return "begins or ends with /"
	case strings.HasSuffix(ref, "."):
		return "ends with ."
	case strings.Contains(ref, ".."):
		return "contains .."
	case strings.Contains(ref, "@{"):
		return "contains @{"
	case !strings.Contains(ref, "/"):
		return "has one level only"
	}
	for _, r := range ref {
		if r < 0x20 || r == 0x7f {
			return "contains a control character"
		}
		if strings.ContainsRune(" ~^:?*[\\+", r) {
			return fmt.Sprintf("contains %q", r)
		}
	}
	for _, c := range strings.Split(ref, "/") {
		switch {
		case c == "":
			return "contains //"
		case strings.HasPrefix(c, "."):
			return "a component begins with ."
		case strings.HasSuffix(c, ".lock"):
			return "a component ends with .lock"
		}
	}
	return ""
}
