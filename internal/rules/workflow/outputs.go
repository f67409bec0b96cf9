package workflow

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
)

// A step's outputs are the key=value lines it writes to the file
// $KNOTLESS_RUN_STEP_OUTPUT; a later step reads them in its if
// (steps.NAME.outputs.KEY) and its env (${{ steps.NAME.outputs.KEY }}).

// Bounds on a step's outputs: they are read from the session, written
// by the step's code.
const (
	// MaxOutputBytes bounds one step's outputs file; a larger one is an
	// error of the step that reads it.
	MaxOutputBytes = 64 << 10
	// MaxOutputKeys bounds one step's outputs.
	MaxOutputKeys = 256
)

var (
	// stepIdent is a step name its outputs can be read by: a CEL
	// identifier.
	stepIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// outputKey is the key of an output.
	outputKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)
	// outputRef is a reference to an output in a step's env.
	outputRef = regexp.MustCompile(`\$\{\{\s*steps\.([A-Za-z_][A-Za-z0-9_]*)\.outputs\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}`)
	// anyOutputRef is any ${{ … }} that starts with steps: those
	// outputRef does not read are errors.
	anyOutputRef = regexp.MustCompile(`\$\{\{\s*steps\b[^}]*\}\}`)
)

// stepOutputsVar is the condition variable of step name's outputs.
func stepOutputsVar(name string) string { return "steps." + name + ".outputs" }

// Outputs are the outputs of a run's steps, by step index.
type Outputs map[int]map[string]string

// ParseOutputs reads a step's outputs file: key=value lines (a key is
// letters, digits, _ and -, not starting with a digit or -; the value
// is the rest of the line, without a trailing \r; a later line of a key
// wins). Blank lines are skipped; any other line is a problem, named by
// its number and left out, as are keys past MaxOutputKeys.
func ParseOutputs(data []byte) (map[string]string, []string) {
	out := map[string]string{}
	var problems []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, MaxOutputBytes+1)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		switch _, known := out[key]; {
		case !ok || !outputKey.MatchString(key):
			problems = append(problems, fmt.Sprintf("line %d: not key=value with a key of letters, digits, _ and -", n))
		case strings.IndexByte(value, 0) >= 0:
			problems = append(problems, fmt.Sprintf("line %d: %s: the value holds a NUL byte", n, key))
		case !known && len(out) == MaxOutputKeys:
			problems = append(problems, fmt.Sprintf("line %d: %s: more than %d outputs", n, key, MaxOutputKeys))
		default:
			out[key] = value
		}
	}
	return out, problems
}

// StepEnv is step i's own env, each ${{ steps.NAME.outputs.KEY }}
// replaced by that output ("" where the step wrote none).
func (w *Workflow) StepEnv(i int, outs Outputs) []EnvVar {
	env := make([]EnvVar, 0, len(w.Steps[i].Env))
	for _, e := range w.Steps[i].Env {
		v := outputRef.ReplaceAllStringFunc(e.Value, func(ref string) string {
			m := outputRef.FindStringSubmatch(ref)
			if j := w.stepIndex(m[1]); j >= 0 {
				return outs[j][m[2]]
			}
			return ""
		})
		env = append(env, EnvVar{Name: e.Name, Value: v})
	}
	return env
}

// OutputVars sets, in a condition's variables, steps.NAME.outputs of
// every step a condition may read: its outputs in outs, else none.
func (w *Workflow) OutputVars(vars map[string]any, outs Outputs) {
	for j, s := range w.Steps {
		if stepIdent.MatchString(s.Name) {
			m := outs[j]
			if m == nil {
				m = map[string]string{}
			}
			vars[stepOutputsVar(s.Name)] = m
		}
	}
}

func (w *Workflow) stepIndex(name string) int {
	return slices.IndexFunc(w.Steps, func(s Step) bool { return s.Name == name })
}

// stepNames are the names of the steps of the list n, as steps will
// name them, read ahead: a step's condition may read the outputs of a
// step by its name, which must be known before the steps are.
func stepNames(seq *ast.SequenceNode) []string {
	names := make([]string, len(seq.Values))
	for i, sn := range seq.Values {
		names[i] = fmt.Sprintf("step %d", i+1)
		m, ok := deref(sn).(*ast.MappingNode)
		if !ok {
			continue
		}
		for _, mv := range m.Values {
			switch v := deref(mv.Value).(type) {
			case *ast.StringNode:
				if k := mv.Key.GetToken().Value; k == "name" || (k == "uses" && names[i] == fmt.Sprintf("step %d", i+1)) {
					names[i] = v.Value
				}
			}
		}
	}
	return names
}

// outputSteps are the names among names a condition reads the outputs
// of (CEL identifiers).
func outputSteps(names []string) []string {
	var out []string
	for _, n := range names {
		if stepIdent.MatchString(n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// stepEnv reads step i's env: NAME: value, each name a shell name (not
// KNOTLESS_*, not a secret the workflow grants); a value's
// ${{ steps.NAME.outputs.KEY }} names an earlier step, its
// ${{ matrix.NAME }} a key of the matrix.
func (d *decoder) stepEnv(i int, n ast.Node, w *Workflow, names []string) (env []EnvVar, reads bool) {
	m, ok := n.(*ast.MappingNode)
	if !ok {
		d.errorAt(n.GetToken(), "steps[%d].env: want a mapping of NAME: value, got %s", i, kind(n))
		return nil, false
	}
	for _, mv := range m.Values {
		ktk := mv.Key.GetToken()
		name := ktk.Value
		switch {
		case !shellName.MatchString(name) || strings.HasPrefix(name, "KNOTLESS_"):
			d.errorAt(ktk, "steps[%d].env: %q is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved)", i, name)
		case slices.Contains(w.Secrets, name):
			d.errorAt(ktk, "steps[%d].env: %q is a secret the workflow grants", i, name)
		case slices.ContainsFunc(env, func(e EnvVar) bool { return e.Name == name }):
			d.errorAt(ktk, "steps[%d].env: duplicate field %q", i, name)
		}
		s := d.str(fmt.Sprintf("steps[%d].env.%s", i, name), deref(mv.Value))
		for _, loc := range anyOutputRef.FindAllStringIndex(s.value, -1) {
			text := s.value[loc[0]:loc[1]]
			sub := outputRef.FindStringSubmatch(text)
			switch {
			case sub == nil:
				d.errorAt(s.tk, "steps[%d].env.%s: %q: want ${{ steps.NAME.outputs.KEY }}", i, name, text)
			case !slices.Contains(names[:i], sub[1]):
				d.errorAt(s.tk, "steps[%d].env.%s: %q: %q is not an earlier step", i, name, text, sub[1])
			default:
				reads = true
			}
		}
		d.matrixRefs(w, []subRef{{fmt.Sprintf("steps[%d].env.%s", i, name), s}})
		env = append(env, EnvVar{Name: name, Value: s.value})
	}
	return env, reads
}

// checkCondOutputs refuses a step condition that reads the outputs of
// a step not before it (names: the steps' names, i: the step's index).
func (d *decoder) checkCondOutputs(i int, c *Cond, tk *token.Token, names []string) {
	for _, name := range c.Outputs {
		if !slices.Contains(names[:i], name) {
			d.errorAt(tk, "steps[%d].if: %s: %q is not an earlier step", i, stepOutputsVar(name), name)
		}
	}
}
