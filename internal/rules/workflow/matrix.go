package workflow

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"

	"knotless.dev/run/internal/lib/termsafe"
	"knotless.dev/run/internal/rules/class"
)

// Bounds on a matrix: every leg is a run and a check, and the file is
// written by anyone who may open a pull.
const (
	// MaxLegs is how many legs a matrix may have, after include and
	// exclude.
	MaxLegs = 256
	// maxProduct bounds the named lists' product before exclude, so
	// that a file of a few lines cannot make the parser count 10^10
	// legs to find that excludes leave 200.
	maxProduct = 16 * MaxLegs
	// MaxMatrixValue bounds one matrix value, in bytes.
	MaxMatrixValue = 100
	// maxLegName is the longest leg name: a check's workflow field.
	maxLegName = 255
)

// Matrix is a workflow's matrix: its named value lists, crossed, less
// the excluded legs, with the included values added; each leg is a run
// with its own check (Workflow.Legs).
type Matrix struct {
	// Keys are the names the legs' values have: the named lists' in
	// file order, then those only include entries name.
	Keys []string
	// MaxParallel bounds how many legs of one event run at once; 0
	// bounds nothing but the runner's concurrency.
	MaxParallel int
	// FailFast: a leg that ends failure or error cancels the others
	// of its event, queued and running.
	FailFast bool
	// legs are the legs' values, in order, as Parse expanded them.
	legs [][]EnvVar
}

// Leg is what a leg of a matrix knows of it: set on the workflows
// Legs returns, nil on the workflow a file parses to.
type Leg struct {
	// Base is the matrix workflow's name (its file stem); the leg's own
	// name is Base followed by its values.
	Base string
	// Values are the leg's values, in the order of the matrix's keys
	// (a key an include entry gives only some legs is left out of the
	// others).
	Values      []EnvVar
	MaxParallel int
	FailFast    bool
}

// matrixRef is a reference to a matrix value in image, env and
// runners: ${{ matrix.NAME }}.
var matrixRef = regexp.MustCompile(`\$\{\{\s*matrix\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)

// anyMatrixRef is any ${{ … }} that starts with matrix: those
// matrixRef does not read are errors, not text.
var anyMatrixRef = regexp.MustCompile(`\$\{\{\s*matrix\b[^}]*\}\}`)

// LegName is the name of a leg of the workflow base with values: the
// check's workflow, which its key is derived from, so each leg is its
// own check and its own run.
func LegName(base string, values []EnvVar) string {
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = v.Name + "=" + v.Value
	}
	return base + " (" + strings.Join(parts, ", ") + ")"
}

// Legs plans the workflow: a workflow without a matrix is its one run;
// a matrix's are its legs, in order, each a copy of the workflow named
// after its values (LegName), with the values in its env (after the
// workflow's own), substituted for ${{ matrix.NAME }} in its image,
// env and runners, and read by its conditions as matrix.NAME.
func (w *Workflow) Legs() []*Workflow {
	if w.Matrix == nil {
		return []*Workflow{w}
	}
	out := make([]*Workflow, 0, len(w.Matrix.legs))
	for _, values := range w.Matrix.legs {
		out = append(out, w.leg(values))
	}
	return out
}

func (w *Workflow) leg(values []EnvVar) *Workflow {
	l := *w
	l.Name = LegName(w.Name, values)
	l.Leg = &Leg{Base: w.Name, Values: values, MaxParallel: w.Matrix.MaxParallel, FailFast: w.Matrix.FailFast}
	sub := func(s string) string { return substitute(s, values) }
	l.Image = sub(w.Image)
	l.Class = sub(w.Class)
	l.Runners = make([]string, len(w.Runners))
	for i, r := range w.Runners {
		l.Runners[i] = sub(r)
	}
	l.Env = make([]EnvVar, 0, len(w.Env)+len(values))
	for _, e := range w.Env {
		l.Env = append(l.Env, EnvVar{Name: e.Name, Value: sub(e.Value)})
	}
	l.Env = append(l.Env, values...)
	if slices.ContainsFunc(w.Steps, func(s Step) bool { return len(s.Env) > 0 }) {
		l.Steps = slices.Clone(w.Steps)
		for i, s := range l.Steps {
			if len(s.Env) == 0 {
				continue
			}
			env := make([]EnvVar, len(s.Env))
			for j, e := range s.Env {
				env[j] = EnvVar{Name: e.Name, Value: sub(e.Value)}
			}
			l.Steps[i].Env = env
		}
	}
	return &l
}

// substitute replaces each ${{ matrix.NAME }} of s with the value of
// NAME ("" for a key the leg has not).
func substitute(s string, values []EnvVar) string {
	if !strings.Contains(s, "${{") {
		return s
	}
	return matrixRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := matrixRef.FindStringSubmatch(ref)[1]
		for _, v := range values {
			if v.Name == name {
				return v.Value
			}
		}
		return ""
	})
}

// FileName is the workflow's file stem: its name, or a leg's
// matrix's name (what an operator's secret names, what a dispatch
// names).
func (w *Workflow) FileName() string {
	if w.Leg != nil {
		return w.Leg.Base
	}
	return w.Name
}

// LegOf finds the workflow or matrix leg named name among wfs' legs.
func LegOf(wfs []*Workflow, name string) *Workflow {
	for _, w := range wfs {
		if w.Matrix == nil {
			if w.Name == name {
				return w
			}
			continue
		}
		if !strings.HasPrefix(name, w.Name+" (") {
			continue
		}
		for _, values := range w.Matrix.legs {
			if LegName(w.Name, values) == name {
				return w.leg(values)
			}
		}
	}
	return nil
}

// Plan is the legs of every workflow of wfs (Legs), in order, but that
// a workflow comes after those it needs, whose runs its needs name
// (Need.Runs).
func Plan(wfs []*Workflow) []*Workflow {
	var out []*Workflow
	for _, w := range planNeeds(wfs) {
		out = append(out, w.Legs()...)
	}
	return out
}

// matrixReserved are the matrix's settings, not value lists.
var matrixReserved = []string{"include", "exclude", "max-parallel", "fail-fast"}

// matrix reads the matrix field: named lists of values, include,
// exclude, max-parallel and fail-fast; it expands the legs, at most
// MaxLegs of them.
func (d *decoder) matrix(n ast.Node, w *Workflow) {
	m, ok := n.(*ast.MappingNode)
	if !ok {
		d.errorAt(n.GetToken(), "matrix: want a mapping of NAME: [values] (and include, exclude, max-parallel, fail-fast), got %s", kind(n))
		return
	}
	mx := &Matrix{}
	d.matrixTk = tokenOf(m)
	var lists [][]string
	var include, exclude [][]EnvVar
	var excludeTk []*token.Token
	before := len(d.errs)
	seen := map[string]bool{}
	for _, mv := range m.Values {
		ktk := mv.Key.GetToken()
		key := ktk.Value
		v := deref(mv.Value)
		if seen[key] {
			d.errorAt(ktk, "matrix: duplicate field %q", key)
			continue
		}
		seen[key] = true
		switch key {
		case "max-parallel":
			s := d.str("matrix.max-parallel", v)
			n, err := strconv.Atoi(s.value)
			if err != nil || n < 1 {
				d.errorAt(s.tk, "matrix.max-parallel: want a positive number of legs, got %q", s.value)
			}
			mx.MaxParallel = n
		case "fail-fast":
			b, ok := v.(*ast.BoolNode)
			if !ok {
				d.errorAt(v.GetToken(), "matrix.fail-fast: want true or false, got %s", kind(v))
				continue
			}
			mx.FailFast = b.Value
		case "include", "exclude":
			seq, ok := v.(*ast.SequenceNode)
			if !ok {
				d.errorAt(v.GetToken(), "matrix.%s: want a list of mappings NAME: value, got %s", key, kind(v))
				continue
			}
			for i, en := range seq.Values {
				entry := d.matrixEntry(fmt.Sprintf("matrix.%s[%d]", key, i), deref(en))
				if key == "include" {
					include = append(include, entry)
				} else {
					exclude, excludeTk = append(exclude, entry), append(excludeTk, tokenOf(deref(en)))
				}
			}
		default:
			d.matrixName(ktk)
			seq, ok := v.(*ast.SequenceNode)
			if !ok || len(seq.Values) == 0 {
				d.errorAt(v.GetToken(), "matrix.%s: want a list of at least one value, got %s", key, kind(v))
				continue
			}
			var vals []string
			for _, vn := range seq.Values {
				s := d.matrixValue("matrix."+key, deref(vn))
				if slices.Contains(vals, s.value) {
					d.errorAt(s.tk, "matrix.%s: %q is listed twice", key, s.value)
				}
				vals = append(vals, s.value)
			}
			mx.Keys = append(mx.Keys, key)
			lists = append(lists, vals)
		}
	}
	listKeys := slices.Clone(mx.Keys)
	for i, entry := range exclude {
		for _, e := range entry {
			if !slices.Contains(listKeys, e.Name) {
				d.errorAt(excludeTk[i], "matrix.exclude[%d]: %q is not one of the matrix's lists (%s)", i, e.Name, strings.Join(listKeys, ", "))
			}
		}
	}
	for _, entry := range include {
		for _, e := range entry {
			if !slices.Contains(mx.Keys, e.Name) {
				mx.Keys = append(mx.Keys, e.Name)
			}
		}
	}
	if len(mx.Keys) == 0 {
		d.errorAt(tokenOf(m), "matrix: want at least one named list of values, or include")
	}
	if len(d.errs) > before {
		return
	}
	legs, err := expand(listKeys, lists, include, exclude)
	if err != nil {
		d.errorAt(tokenOf(m), "matrix: %v", err)
		return
	}
	for _, leg := range legs {
		slices.SortStableFunc(leg, func(a, b EnvVar) int {
			return slices.Index(mx.Keys, a.Name) - slices.Index(mx.Keys, b.Name)
		})
	}
	names := map[string]bool{}
	for _, leg := range legs {
		name := LegName(w.Name, leg)
		switch {
		case names[name]:
			d.errorAt(tokenOf(m), "matrix: two legs are both %q", name)
			return
		case len(name) > maxLegName:
			d.errorAt(tokenOf(m), "matrix: the leg name %q is %d bytes, more than %d (a check's workflow field)", name, len(name), maxLegName)
			return
		}
		names[name] = true
	}
	all := crossed(listKeys, lists, maxProduct)
	for i, entry := range exclude {
		if !slices.ContainsFunc(all, func(leg []EnvVar) bool { return matches(leg, entry) }) {
			d.errorAt(excludeTk[i], "matrix.exclude[%d]: excludes no leg", i)
		}
	}
	mx.legs = legs
	w.Matrix = mx
}

// matrixName checks a matrix key: a variable name the steps get.
func (d *decoder) matrixName(tk *token.Token) {
	name := tk.Value
	if !shellName.MatchString(name) || strings.HasPrefix(name, "KNOTLESS_") {
		d.errorAt(tk, "matrix: %q is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved; the settings are %s)", name, strings.Join(matrixReserved, ", "))
	}
}

// matrixValue reads one value of a matrix: a scalar, at most
// MaxMatrixValue bytes, without a character that could make the leg's
// name read as another.
func (d *decoder) matrixValue(what string, n ast.Node) scalar {
	s := d.str(what, n)
	if r, ok := termsafe.UnsafeRune(s.value); ok {
		d.errorAt(s.tk, "%s: character %U not allowed in a matrix value", what, r)
	}
	if len(s.value) > MaxMatrixValue {
		d.errorAt(s.tk, "%s: a matrix value is at most %d bytes, got %d", what, MaxMatrixValue, len(s.value))
	}
	if s.value == "" {
		d.errorAt(s.tk, "%s: want a value, got nothing", what)
	}
	return s
}

// matrixEntry reads an include or exclude entry: NAME: value.
func (d *decoder) matrixEntry(what string, n ast.Node) []EnvVar {
	m, ok := n.(*ast.MappingNode)
	if !ok || len(m.Values) == 0 {
		d.errorAt(n.GetToken(), "%s: want a mapping of NAME: value, got %s", what, kind(n))
		return nil
	}
	var out []EnvVar
	for _, mv := range m.Values {
		ktk := mv.Key.GetToken()
		if slices.ContainsFunc(out, func(e EnvVar) bool { return e.Name == ktk.Value }) {
			d.errorAt(ktk, "%s: duplicate field %q", what, ktk.Value)
			continue
		}
		if slices.Contains(matrixReserved, ktk.Value) {
			d.errorAt(ktk, "%s: %q is a setting of the matrix, not a value", what, ktk.Value)
			continue
		}
		d.matrixName(ktk)
		s := d.matrixValue(what+"."+ktk.Value, deref(mv.Value))
		out = append(out, EnvVar{Name: ktk.Value, Value: s.value})
	}
	return out
}

// crossed is the product of the lists, the first key varying slowest;
// nil when it has more than limit legs.
func crossed(keys []string, lists [][]string, limit int) [][]EnvVar {
	if len(keys) == 0 {
		return nil
	}
	n := 1
	for _, l := range lists {
		n *= len(l)
		if n > limit {
			return nil
		}
	}
	out := make([][]EnvVar, 0, n)
	idx := make([]int, len(lists))
	for range n {
		leg := make([]EnvVar, len(keys))
		for k := range keys {
			leg[k] = EnvVar{Name: keys[k], Value: lists[k][idx[k]]}
		}
		out = append(out, leg)
		for k := len(idx) - 1; k >= 0; k-- {
			idx[k]++
			if idx[k] < len(lists[k]) {
				break
			}
			idx[k] = 0
		}
	}
	return out
}

// product is the number of legs the lists cross to, or -1 past limit.
func product(lists [][]string, limit int) int {
	if len(lists) == 0 {
		return 0
	}
	n := 1
	for _, l := range lists {
		n *= len(l)
		if n > limit {
			return -1
		}
	}
	return n
}

// matches reports whether every value of entry is the leg's.
func matches(leg, entry []EnvVar) bool {
	for _, e := range entry {
		i := slices.IndexFunc(leg, func(v EnvVar) bool { return v.Name == e.Name })
		if i < 0 || leg[i].Value != e.Value {
			return false
		}
	}
	return true
}

// expand makes the legs: the lists crossed (the first varying
// slowest), less each leg an exclude entry matches (all its values are
// the leg's), then each include entry added, as GitHub Actions does:
// to every leg whose list values it does not contradict, its other
// values (an include may replace what an earlier include added, never
// a list's value); an entry that fits no leg is a leg of its own.
func expand(keys []string, lists [][]string, include, exclude [][]EnvVar) ([][]EnvVar, error) {
	if p := product(lists, maxProduct); p < 0 {
		return nil, fmt.Errorf("the lists cross to more than %d legs before exclude; a matrix has at most %d", maxProduct, MaxLegs)
	}
	var legs [][]EnvVar
	for _, leg := range crossed(keys, lists, maxProduct) {
		if !slices.ContainsFunc(exclude, func(e []EnvVar) bool { return matches(leg, e) }) {
			legs = append(legs, leg)
		}
	}
	base := len(legs)
	for _, entry := range include {
		var own, extra []EnvVar
		for _, e := range entry {
			if slices.Contains(keys, e.Name) {
				own = append(own, e)
			} else {
				extra = append(extra, e)
			}
		}
		fit := false
		for i := range legs[:base] {
			if len(keys) == 0 || !matches(legs[i], own) {
				continue
			}
			fit = true
			for _, e := range extra {
				if j := slices.IndexFunc(legs[i], func(v EnvVar) bool { return v.Name == e.Name }); j >= 0 {
					legs[i][j].Value = e.Value
				} else {
					legs[i] = append(legs[i], e)
				}
			}
		}
		if !fit {
			legs = append(legs, slices.Clone(entry))
		}
		if len(legs) > MaxLegs {
			return nil, fmt.Errorf("%d legs or more, more than the limit of %d", len(legs), MaxLegs)
		}
	}
	if len(legs) > MaxLegs {
		return nil, fmt.Errorf("%d legs, more than the limit of %d", len(legs), MaxLegs)
	}
	return legs, nil
}

// subRef is a scalar of a field a matrix value may be substituted in.
type subRef struct {
	field string
	s     scalar
}

// matrixKeys are the names conditions read as matrix.NAME.
func (w *Workflow) matrixKeys() []string {
	if w.Matrix == nil {
		return nil
	}
	return w.Matrix.Keys
}

// matrixUses checks what the whole file says of the matrix: each
// ${{ matrix.NAME }} in image, env and runners names a key of it; each
// runner is a DID in every leg; and no key stands beside an env entry,
// a granted secret or a dispatch input of its name (the steps get it
// as a variable of that name).
func (d *decoder) matrixUses(w *Workflow, refs []subRef) {
	d.matrixRefs(w, refs)
	d.matrixKeysApart(w, refs)
}

// matrixRefs checks that each ${{ matrix.NAME }} of refs names a key of
// the workflow's matrix.
func (d *decoder) matrixRefs(w *Workflow, refs []subRef) {
	keys := w.matrixKeys()
	for _, r := range refs {
		for _, loc := range anyMatrixRef.FindAllStringIndex(r.s.value, -1) {
			text := r.s.value[loc[0]:loc[1]]
			sub := matrixRef.FindStringSubmatch(text)
			switch {
			case sub == nil:
				d.errorAt(r.s.tk, "%s: %q: want ${{ matrix.NAME }}", r.field, text)
			case w.Matrix == nil:
				d.errorAt(r.s.tk, "%s: %q: the workflow has no matrix", r.field, text)
			case !slices.Contains(keys, sub[1]):
				d.errorAt(r.s.tk, "%s: %q: the matrix has no %q (known: %s)", r.field, text, sub[1], strings.Join(keys, ", "))
			}
		}
	}
}

// matrixKeysApart checks that each leg's class is a class's name and
// each runner a DID in every leg, and
// that no key stands beside an env entry, a granted secret or a
// dispatch input of its name.
func (d *decoder) matrixKeysApart(w *Workflow, refs []subRef) {
	keys := w.matrixKeys()
	if w.Matrix == nil {
		return
	}
	for _, r := range refs {
		if r.field != "class" || !strings.Contains(r.s.value, "${{") {
			continue
		}
		for _, values := range w.Matrix.legs {
			if err := class.ValidName(substitute(r.s.value, values)); err != nil {
				d.errorAt(r.s.tk, "class: in the leg %s: %v", LegName(w.Name, values), err)
				break
			}
		}
	}
	for _, r := range refs {
		if r.field != "runners" || !strings.Contains(r.s.value, "${{") {
			continue
		}
		for _, values := range w.Matrix.legs {
			if v := substitute(r.s.value, values); !strings.HasPrefix(v, "did:") {
				d.errorAt(r.s.tk, "runners: %q is not a DID in the leg %s (want did:plc:… or did:web:…)", v, LegName(w.Name, values))
				break
			}
		}
	}
	for _, k := range keys {
		switch {
		case slices.ContainsFunc(w.Env, func(e EnvVar) bool { return e.Name == k }):
			d.errorAt(d.matrixTk, "matrix: %q is also an env entry; a leg's steps get its value as that variable", k)
		case slices.Contains(w.Secrets, k):
			d.errorAt(d.matrixTk, "matrix: %q is a secret the workflow grants; a matrix value of that name would stand beside it", k)
		case slices.ContainsFunc(w.Inputs, func(in Input) bool { return in.Name == k }):
			d.errorAt(d.matrixTk, "matrix: %q is also a dispatch input", k)
		}
	}
}
