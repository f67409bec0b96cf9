package workflow

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"knotless.dev/run/internal/lib/termsafe"
)

// CheckArtifact refuses an artifacts entry that is not a pattern of
// paths inside the outputs directory: empty, absolute, with an empty,
// "." or ".." part, a part with "**" beside other characters, a bad
// path.Match pattern, or a control or bidirectional formatting
// character (a name a reader could be misled by).
func CheckArtifact(pattern string) error {
	switch {
	case pattern == "":
		return errors.New("empty path")
	case strings.HasPrefix(pattern, "/"):
		return errors.New("absolute path: want a path relative to the outputs directory")
	}
	if r, ok := termsafe.UnsafeRune(pattern); ok {
		return fmt.Errorf("character %U not allowed", r)
	}
	for _, part := range strings.Split(pattern, "/") {
		switch {
		case part == "", part == ".":
			return fmt.Errorf("empty or %q part: write the path clean", ".")
		case part == "..":
			return errors.New(`".." not allowed`)
		case part == "**":
		case strings.Contains(part, "**"):
			return fmt.Errorf("%q: ** must be a whole part (a/**/b), elsewhere * does", part)
		default:
			if _, err := path.Match(part, ""); err != nil {
				return fmt.Errorf("bad pattern %q: %v", part, err)
			}
		}
	}
	return nil
}

// MatchArtifact reports whether name, a slash-separated path relative
// to the outputs directory, is one that pattern (a valid artifacts
// entry) names. Each part of the pattern matches one part of the name
// as path.Match does (so * never crosses a /, and matches a leading
// dot too), except that a part "**" matches any number of parts, none
// included. A name that is not a clean relative path (empty, absolute,
// with an empty, "." or ".." part) matches nothing.
func MatchArtifact(pattern, name string) bool {
	parts := strings.Split(name, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return false
		}
	}
	return matchParts(strings.Split(pattern, "/"), parts)
}

// matchParts matches name's parts against the pattern's, from the
// last part back: next[j] says whether the pattern's parts after the
// current one match name[j:]. At most len(pat)·(len(name)+1) steps,
// however many "**" the pattern has.
func matchParts(pat, name []string) bool {
	next := make([]bool, len(name)+1)
	cur := make([]bool, len(name)+1)
	next[len(name)] = true
	for i := len(pat) - 1; i >= 0; i-- {
		for j := len(name); j >= 0; j-- {
			switch {
			case pat[i] == "**":
				cur[j] = next[j] || (j < len(name) && cur[j+1])
			case j == len(name):
				cur[j] = false
			default:
				ok, err := path.Match(pat[i], name[j])
				cur[j] = ok && err == nil && next[j+1]
			}
		}
		next, cur = cur, next
	}
	return next[0]
}

// Published returns the outputs (paths relative to the outputs
// directory) that an artifacts entry of the workflow names, in their
// order: the files of a run that may be published. A workflow without
// artifacts publishes none.
func (w *Workflow) Published(outputs []string) []string {
	var out []string
	for _, name := range outputs {
		for _, p := range w.Artifacts {
			if MatchArtifact(p, name) {
				out = append(out, name)
				break
			}
		}
	}
	return out
}
