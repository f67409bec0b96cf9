package workflow

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
)

// ArtifactsDir is where, in the checkout of a run, the artifacts of the
// runs it needs are put: ArtifactsDir/<run>/<path>, <run> the needed
// workflow's name (a leg's: its name with its values), <path> the
// artifact's path in that run's outputs directory.
const ArtifactsDir = ".knotless/artifacts"

// Need is one workflow a workflow needs (`needs:`): its runs for the
// same event must succeed before this one runs.
type Need struct {
	Name string
	Position
	// Runs are the names of the needed workflow's runs: its legs, or
	// itself; filled in by Plan.
	Runs []string
}

// needs reads `needs:`: a workflow's name, or a list of them, each once
// and not the workflow's own. Whether each exists, and the cycles, are
// CheckNeeds's: they span files.
func (d *decoder) needs(w *Workflow, k string, v ast.Node) {
	for _, s := range d.strings(k, v) {
		pos := Position{File: d.file, Line: 1, Column: 1}
		if s.tk != nil && s.tk.Position != nil {
			pos.Line, pos.Column = s.tk.Position.Line, s.tk.Position.Column
		}
		switch {
		case s.value == "":
			d.errorAt(s.tk, "needs: want a workflow's name (its file's name without .yaml), got none")
			continue
		case strings.ContainsAny(s.value, "/\x00\n") || s.value == "." || s.value == "..":
			d.errorAt(s.tk, "needs: %q: want a workflow's name (its file's name without .yaml), not a path", s.value)
			continue
		case s.value == w.Name:
			d.errorAt(s.tk, "needs: %q is this workflow: a workflow cannot need itself", s.value)
			continue
		case slices.ContainsFunc(w.Needs, func(n Need) bool { return n.Name == s.value }):
			d.errorAt(s.tk, "needs: %q is named twice", s.value)
			continue
		}
		w.Needs = append(w.Needs, Need{Name: s.value, Position: pos})
	}
}

// CheckNeeds checks the needs of the workflows of one directory
// against each other: each needed workflow is one of them (or one of
// invalid, the names of its files that do not parse, whose own errors
// say why), runs on every trigger of the workflow that needs it (and is
// a pre-flight, queue: first, when it is), and no workflow needs itself
// through others (a cycle). It returns the errors
// of each workflow that has some, by name, each an Errors of its file.
func CheckNeeds(wfs []*Workflow, invalid ...string) map[string]Errors {
	byName := map[string]*Workflow{}
	var names []string
	for _, w := range wfs {
		byName[w.Name] = w
		names = append(names, w.Name)
	}
	slices.Sort(names)
	out := map[string]Errors{}
	add := func(w *Workflow, pos Position, format string, args ...any) {
		out[w.Name] = append(out[w.Name], Error{pos, fmt.Sprintf(format, args...)})
	}
	for _, w := range wfs {
		for _, n := range w.Needs {
			other, ok := byName[n.Name]
			if !ok {
				if !slices.Contains(invalid, n.Name) {
					add(w, n.Position, "needs: %q: no workflow of that name in %s (known: %s)", n.Name, path.Dir(w.File), strings.Join(names, ", "))
				}
				continue
			}
			if w.Queue == "first" && other.Queue != "first" {
				add(w, n.Position, "needs: %q is not queue: first, which %s is: a pre-flight runs only the queue: first workflows", n.Name, w.Name)
			}
			for _, t := range w.On {
				if !slices.Contains(other.On, t) {
					add(w, n.Position, "needs: %q does not run on %s, which %s runs on: a needed workflow runs on every event of the one that needs it",
						n.Name, t, w.Name)
				}
			}
		}
	}
	for _, cycle := range needCycles(wfs, byName) {
		text := strings.Join(append(slices.Clone(cycle), cycle[0]), " → ")
		for i, name := range cycle {
			w := byName[name]
			next := cycle[(i+1)%len(cycle)]
			for _, n := range w.Needs {
				if n.Name == next {
					add(w, n.Position, "needs: %q makes a cycle: %s", next, text)
				}
			}
		}
	}
	for name := range out {
		slices.SortFunc(out[name], func(a, b Error) int {
			if a.Line != b.Line {
				return a.Line - b.Line
			}
			return a.Column - b.Column
		})
	}
	return out
}

// needCycles finds the cycles of the needs graph, each once, as the
// names along it from its least name on; a workflow in several cycles
// is reported in the first found.
func needCycles(wfs []*Workflow, byName map[string]*Workflow) [][]string {
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string
	var cycles [][]string
	var visit func(name string)
	visit = func(name string) {
		state[name] = onPath
		path = append(path, name)
		for _, n := range byName[name].Needs {
			if _, ok := byName[n.Name]; !ok {
				continue
			}
			switch state[n.Name] {
			case unseen:
				visit(n.Name)
			case onPath:
				i := slices.Index(path, n.Name)
				cycle := slices.Clone(path[i:])
				least := slices.Index(cycle, slices.Min(cycle))
				cycles = append(cycles, append(cycle[least:], cycle[:least]...))
			}
		}
		path = path[:len(path)-1]
		state[name] = done
	}
	sorted := slices.Clone(wfs)
	slices.SortFunc(sorted, func(a, b *Workflow) int { return strings.Compare(a.Name, b.Name) })
	for _, w := range sorted {
		if state[w.Name] == unseen {
			visit(w.Name)
		}
	}
	return cycles
}

// planNeeds returns wfs ordered so that each workflow comes after those
// it needs (else in their order: a cycle, which CheckNeeds refuses,
// keeps its order), each need's Runs filled in, and Needed set on the
// workflows others need. The workflows that have needs or are needed
// are copies: wfs is not changed.
func planNeeds(wfs []*Workflow) []*Workflow {
	byName := map[string]*Workflow{}
	needed := map[string]bool{}
	for _, w := range wfs {
		byName[w.Name] = w
		for _, n := range w.Needs {
			needed[n.Name] = true
		}
	}
	if len(needed) == 0 {
		return wfs
	}
	copied := make([]*Workflow, len(wfs))
	for i, w := range wfs {
		if len(w.Needs) == 0 && !needed[w.Name] {
			copied[i] = w
			continue
		}
		c := *w
		c.Needed = needed[w.Name]
		c.Needs = slices.Clone(w.Needs)
		for j, n := range c.Needs {
			if other, ok := byName[n.Name]; ok {
				c.Needs[j].Runs = runNames(other)
			}
		}
		copied[i] = &c
	}
	// A stable topological order: each round takes, in order, those
	// whose needs are placed; what is left in the end is a cycle.
	placed := map[string]bool{}
	var out []*Workflow
	left := copied
	for len(left) > 0 {
		var rest []*Workflow
		for _, w := range left {
			ready := true
			for _, n := range w.Needs {
				if _, ok := byName[n.Name]; ok && !placed[n.Name] {
					ready = false
				}
			}
			if ready {
				out = append(out, w)
				placed[w.Name] = true
			} else {
				rest = append(rest, w)
			}
		}
		if len(rest) == len(left) {
			return append(out, rest...)
		}
		left = rest
	}
	return out
}

// runNames are the names of w's runs: its legs', or its own.
func runNames(w *Workflow) []string {
	if w.Matrix == nil {
		return []string{w.Name}
	}
	names := make([]string, 0, len(w.Matrix.legs))
	for _, values := range w.Matrix.legs {
		names = append(names, LegName(w.Name, values))
	}
	return names
}
