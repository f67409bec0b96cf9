package workflow

import (
	"errors"
	"fmt"
	"strings"

	"github.com/goccy/go-yaml/ast"
)

// PathFilter is the paths or paths-ignore of a push or pull trigger:
// the changed files that make a run of it wanted (Paths), or that do
// not (Ignore); at most one of them is set.
type PathFilter struct {
	Paths, Ignore []string
}

// maxPathPatterns bounds a trigger's patterns: each changed file is
// matched against each of them.
const maxPathPatterns = 64

// PathsAdmit decides a workflow's path filter of trigger t (push or
// pull) for the files a change touched: with paths, some changed file
// matches one of them; with paths-ignore, some changed file matches
// none of them. A trigger without a filter admits every change. When
// it does not admit, why says so, for the skipped check.
func (w *Workflow) PathsAdmit(t Trigger, changed []string) (ok bool, why string) {
	f, has := w.PathFilters[t]
	if !has {
		return true, ""
	}
	matchAny := func(patterns []string, name string) bool {
		for _, p := range patterns {
			if MatchArtifact(p, name) {
				return true
			}
		}
		return false
	}
	if len(f.Paths) > 0 {
		for _, name := range changed {
			if matchAny(f.Paths, name) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("skipped: no file the %s changed (%d) matches on.%s.paths (%s)", t, len(changed), t, strings.Join(f.Paths, ", "))
	}
	for _, name := range changed {
		if !matchAny(f.Ignore, name) {
			return true, ""
		}
	}
	return false, fmt.Sprintf("skipped: every file the %s changed (%d) matches on.%s.paths-ignore (%s)", t, len(changed), t, strings.Join(f.Ignore, ", "))
}

// HasPathFilter reports whether trigger t of the workflow has paths or
// paths-ignore.
func (w *Workflow) HasPathFilter(t Trigger) bool {
	_, ok := w.PathFilters[t]
	return ok
}

// CheckPathPattern refuses a paths or paths-ignore entry that is not a
// pattern of paths in the repository (as CheckArtifact, relative to its
// root), or that starts with "!" (not a negation here: write
// paths-ignore).
func CheckPathPattern(pattern string) error {
	switch {
	case strings.HasPrefix(pattern, "!"):
		return errors.New("a leading ! is not a negation here: list the paths to leave out in paths-ignore")
	case strings.HasPrefix(pattern, "/"):
		return errors.New("absolute path: want a path relative to the repository's root")
	}
	return CheckArtifact(pattern)
}

// triggerPaths reads the settings of on.push or on.pull: paths or
// paths-ignore.
func (d *decoder) triggerPaths(t Trigger, n ast.Node, w *Workflow) {
	what := "on." + string(t)
	var f PathFilter
	read := func(key string, v ast.Node, into *[]string) {
		entries := d.strings(what+"."+key, v)
		if len(entries) == 0 {
			d.errorAt(v.GetToken(), "%s.%s: want at least one pattern", what, key)
		}
		if len(entries) > maxPathPatterns {
			d.errorAt(v.GetToken(), "%s.%s: %d patterns, more than %d", what, key, len(entries), maxPathPatterns)
		}
		for _, s := range entries {
			if err := CheckPathPattern(s.value); err != nil {
				d.errorAt(s.tk, "%s.%s: %q: %v", what, key, s.value, err)
			}
			*into = append(*into, s.value)
		}
	}
	var pathsNode ast.Node
	d.mapping(n, what, map[string]func(string, ast.Node){
		"paths":        func(k string, v ast.Node) { pathsNode = v; read(k, v, &f.Paths) },
		"paths-ignore": func(k string, v ast.Node) { read(k, v, &f.Ignore) },
	})
	if len(f.Paths) > 0 && len(f.Ignore) > 0 {
		d.errorAt(pathsNode.GetToken(), "%s: paths and paths-ignore exclude each other", what)
		return
	}
	if len(f.Paths)+len(f.Ignore) == 0 {
		return
	}
	if w.PathFilters == nil {
		w.PathFilters = map[Trigger]PathFilter{}
	}
	w.PathFilters[t] = f
}
