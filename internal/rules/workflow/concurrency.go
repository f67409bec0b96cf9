package workflow

import (
	"regexp"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
)

// Concurrency is a workflow's concurrency group (`concurrency:`): at
// most one run of the group at a time on the runner, within its
// repository. A newer run of the group replaces one still waiting (its
// check ends cancelled, superseded); with CancelInProgress it also
// cancels the one running.
type Concurrency struct {
	// Group is the group's template: text with ${{ NAME }} placeholders
	// (GroupNames), filled in for each run by GroupOf.
	Group            string
	CancelInProgress bool
}

// maxGroupBytes bounds a concurrency group's template.
const maxGroupBytes = 256

// groupRef is a placeholder of a concurrency group's template.
var groupRef = regexp.MustCompile(`\$\{\{\s*([^}]*?)\s*\}\}`)

// groupEventNames are the event's fields a group may name.
var groupEventNames = []string{"event.kind", "event.ref", "event.branch", "event.base", "workflow"}

// concurrency reads `concurrency:`: a group's template alone, or a
// mapping of group and cancel-in-progress. Its placeholders are checked
// once the whole file is read (concurrencyRefs: the matrix may come
// after it).
func (d *decoder) concurrency(w *Workflow, k string, v ast.Node) (tmpl scalar) {
	if _, ok := deref(v).(*ast.MappingNode); !ok {
		tmpl = d.str(k, v)
		w.Concurrency = &Concurrency{Group: tmpl.value}
		return tmpl
	}
	c := &Concurrency{}
	d.mapping(v, k, map[string]func(string, ast.Node){
		"group": func(k2 string, v ast.Node) {
			tmpl = d.str(k+"."+k2, v)
			c.Group = tmpl.value
		},
		"cancel-in-progress": func(k2 string, v ast.Node) {
			b, ok := v.(*ast.BoolNode)
			if !ok {
				d.errorAt(v.GetToken(), "%s.%s: want true or false, got %s", k, k2, kind(v))
				return
			}
			c.CancelInProgress = b.Value
		},
	}, "group")
	w.Concurrency = c
	return tmpl
}

// concurrencyRefs checks the group's template: not empty, bounded, and
// each placeholder one of the names GroupOf fills in.
func (d *decoder) concurrencyRefs(w *Workflow, tmpl scalar) {
	switch {
	case strings.TrimSpace(tmpl.value) == "":
		d.errorAt(tmpl.tk, "concurrency.group: want a group's name, got none")
		return
	case len(tmpl.value) > maxGroupBytes:
		d.errorAt(tmpl.tk, "concurrency.group: %d bytes, more than %d", len(tmpl.value), maxGroupBytes)
		return
	}
	names := w.groupNames()
	for _, m := range groupRef.FindAllStringSubmatch(tmpl.value, -1) {
		if !slices.Contains(names, m[1]) {
			d.errorAt(tmpl.tk, "concurrency.group: ${{ %s }}: want one of %s", m[1], strings.Join(names, ", "))
		}
	}
	if rest := groupRef.ReplaceAllString(tmpl.value, ""); strings.Contains(rest, "${{") {
		d.errorAt(tmpl.tk, "concurrency.group: a ${{ without its }}")
	}
}

// groupNames are the placeholders a concurrency group may use: the
// event's fields, the workflow's name, and the matrix's keys.
func (w *Workflow) groupNames() []string {
	names := slices.Clone(groupEventNames)
	for _, k := range w.matrixKeys() {
		names = append(names, "matrix."+k)
	}
	return names
}

// GroupOf is the concurrency group of a run of w for ev ("" when w has
// none): its template with each placeholder filled in. event.branch is
// the ref's branch ("" for a tag); workflow is w's name (a leg's: with
// its values); matrix.NAME is the leg's value.
func (w *Workflow) GroupOf(ev CondEvent) string {
	if w.Concurrency == nil {
		return ""
	}
	return groupRef.ReplaceAllStringFunc(w.Concurrency.Group, func(ref string) string {
		name := groupRef.FindStringSubmatch(ref)[1]
		switch name {
		case "event.kind":
			return ev.Kind
		case "event.ref":
			return ev.Ref
		case "event.branch":
			b, _ := strings.CutPrefix(ev.Ref, "refs/heads/")
			if b == ev.Ref {
				return ""
			}
			return b
		case "event.base":
			return ev.Base
		case "workflow":
			return w.Name
		}
		if key, ok := strings.CutPrefix(name, "matrix."); ok && w.Leg != nil {
			for _, v := range w.Leg.Values {
				if v.Name == key {
					return v.Value
				}
			}
		}
		return ""
	})
}
