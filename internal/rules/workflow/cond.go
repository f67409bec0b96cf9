package workflow

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/goccy/go-yaml/token"
	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
)

// State is where a run's earlier steps stand when a step's condition is
// decided: exactly one of the conditions' functions success(), failure()
// and cancelled() holds.
type State int

// The states of a run's earlier steps.
const (
	// StateSuccess: no earlier step failed (a step that may fail,
	// continue-on-error, does not count), and the run is not cancelled.
	StateSuccess State = iota
	// StateFailure: an earlier step failed or ended in error.
	StateFailure
	// StateCancelled: the run was cancelled.
	StateCancelled
)

// CondEvent is what a condition reads of the run's event (event.kind,
// event.ref, event.branch, event.tag, event.base, event.trusted).
type CondEvent struct {
	// Kind is push, pull, batch, dispatch or schedule.
	Kind string
	// Ref is the ref the run is for: a push's ref; a pull's base branch
	// (refs/heads/…); a batch's target branch; a dispatch's ref; a
	// schedule's default branch.
	Ref string
	// Base is a pull's base branch; empty for other events.
	Base string
	// Trusted is a run that gets secrets: a push or dispatch by the
	// owner, a schedule tick; not a pull or a batch.
	Trusted bool
}

// Limits on a condition: it is decided on the runner's host, and a
// pull's workflow is written by anyone.
const (
	// MaxCondBytes bounds a condition's text.
	MaxCondBytes = 2048
	// maxCondCost bounds the work of deciding one condition, in CEL's
	// cost units (about one per operation).
	maxCondCost = 10000
)

// Cond is a compiled `if:` condition: type-checked at parse time (its
// programs are built then), decided by Eval.
type Cond struct {
	Text string
	// Implicit says the condition calls none of the step-state
	// functions, so it holds only where success() does too, as a step
	// without an if: `if: event.branch == "main"` does not run after a
	// failure.
	Implicit bool
	// Outputs are the steps whose outputs the condition reads
	// (steps.NAME.outputs), by name.
	Outputs []string
	// progs are the condition's program for each State: the step-state
	// functions are bound to constants in each.
	progs [3]cel.Program
}

// condVars are the variables every condition may read, beside
// inputs.NAME for each dispatch input.
var condVars = []struct {
	name string
	typ  *cel.Type
}{
	{"event.kind", cel.StringType},
	{"event.ref", cel.StringType},
	{"event.branch", cel.StringType},
	{"event.tag", cel.StringType},
	{"event.base", cel.StringType},
	{"event.trusted", cel.BoolType},
}

// stateFuncs are the step-state functions, in the order of their
// State.
var stateFuncs = []string{"success", "failure", "cancelled"}

// condEnv is the type-checking environment of a workflow's conditions:
// a step's (steps) with the step-state functions, which state, when not
// nil, binds to it; the workflow's without them.
func condEnv(inputs []Input, matrix, outputs []string, steps bool, state *State) (*cel.Env, error) {
	opts := []cel.EnvOption{cel.ParserExpressionSizeLimit(MaxCondBytes)}
	if steps {
		opts = append(opts, cel.Function("always", cel.Overload("always", nil, cel.BoolType,
			cel.FunctionBinding(func(...ref.Val) ref.Val { return types.True }))))
	}
	for i, name := range stateFuncs {
		if !steps {
			break
		}
		var bind []cel.OverloadOpt
		if state != nil {
			holds := types.Bool(*state == State(i))
			bind = append(bind, cel.FunctionBinding(func(...ref.Val) ref.Val { return holds }))
		} else {
			bind = append(bind, cel.LateFunctionBinding())
		}
		opts = append(opts, cel.Function(name, cel.Overload(name, nil, cel.BoolType, bind...)))
	}
	for _, v := range condVars {
		opts = append(opts, cel.Variable(v.name, v.typ))
	}
	for _, in := range inputs {
		typ := cel.StringType
		if in.Type == InputBoolean {
			typ = cel.BoolType
		}
		opts = append(opts, cel.Variable("inputs."+in.Name, typ))
	}
	for _, k := range matrix {
		opts = append(opts, cel.Variable("matrix."+k, cel.StringType))
	}
	for _, name := range outputs {
		opts = append(opts, cel.Variable(stepOutputsVar(name), cel.MapType(cel.StringType, cel.StringType)))
	}
	return cel.NewEnv(opts...)
}

// condEnvs are the condition environments of a workflow's steps
// (steps) or of the workflow: the checker's, and one per State that
// binds the step-state functions to it (the workflow's: one, for
// StateSuccess, without them).
type condEnvs struct {
	steps  bool
	matrix []string
	// outputs are the steps whose outputs conditions read, by name.
	outputs []string
	check   *cel.Env
	bound   [3]*cel.Env
}

func newCondEnvs(inputs []Input, matrix, outputs []string, steps bool) (*condEnvs, error) {
	e := condEnvs{steps: steps, matrix: matrix, outputs: outputs}
	var err error
	if e.check, err = condEnv(inputs, matrix, outputs, steps, nil); err != nil {
		return nil, fmt.Errorf("condition environment: %w", err)
	}
	if !steps {
		e.bound[StateSuccess] = e.check
		return &e, nil
	}
	for i := range e.bound {
		st := State(i)
		if e.bound[i], err = condEnv(inputs, matrix, outputs, true, &st); err != nil {
			return nil, fmt.Errorf("condition environment: %w", err)
		}
	}
	return &e, nil
}

// compile type-checks text as a condition and builds its programs. A
// problem is a CondError at its place in the expression.
func (e *condEnvs) compile(text string, inputs []Input) (*Cond, error) {
	ast, iss := e.check.Compile(text)
	if iss.Err() != nil {
		ie := iss.Errors()[0]
		ce := &CondError{Line: ie.Location.Line(), Column: ie.Location.Column(), Msg: strings.TrimSuffix(ie.Message, " (in container '')")}
		if name, ok := strings.CutPrefix(ce.Msg, "undeclared reference to "); ok {
			ce.Msg = fmt.Sprintf("unknown name %s (known: %s)", nameAt(text, ce.Line, ce.Column, strings.Trim(name, "'")), strings.Join(condNames(inputs, e.matrix, e.outputs, e.steps), ", "))
		}
		return nil, ce
	}
	if ast.OutputType() != cel.BoolType {
		return nil, &CondError{Msg: fmt.Sprintf("want a bool, got %s", ast.OutputType())}
	}
	c := &Cond{Text: text, Implicit: e.steps && !callsStateFunc(ast)}
	for _, ref := range ast.NativeRep().ReferenceMap() {
		if name, ok := strings.CutPrefix(ref.Name, "steps."); ok {
			if name, ok = strings.CutSuffix(name, ".outputs"); ok && !slices.Contains(c.Outputs, name) {
				c.Outputs = append(c.Outputs, name)
			}
		}
	}
	for i, env := range e.bound {
		if env == nil {
			continue
		}
		var err error
		if c.progs[i], err = env.Program(ast, cel.CostLimit(maxCondCost)); err != nil {
			return nil, &CondError{Msg: err.Error()}
		}
	}
	return c, nil
}

// callsStateFunc reports whether a checked condition calls success(),
// failure(), cancelled() or always().
func callsStateFunc(a *cel.Ast) bool {
	for _, ref := range a.NativeRep().ReferenceMap() {
		for _, id := range ref.OverloadIDs {
			if id == "always" || slices.Contains(stateFuncs, id) {
				return true
			}
		}
	}
	return false
}

// CondError is a condition that does not compile, at a line (from 1)
// and column (from 0) of its text; line 0 when it has no place.
type CondError struct {
	Line, Column int
	Msg          string
}

func (e *CondError) Error() string { return e.Msg }

// Eval decides the condition in state for the run's event and its
// variables (a dispatch's inputs among them).
func (c *Cond) Eval(state State, vars map[string]any) (bool, error) {
	if c.Implicit && state != StateSuccess {
		return false, nil
	}
	if state < 0 || int(state) >= len(c.progs) || c.progs[state] == nil {
		return false, fmt.Errorf("if %s: no program for state %d (a condition not made by Parse)", c.Text, state)
	}
	out, _, err := c.progs[state].Eval(vars)
	if err != nil {
		return false, fmt.Errorf("if %s: %w", c.Text, err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("if %s: got %v, not a bool", c.Text, out)
	}
	return b, nil
}

// CondVars are the variables a condition of the workflow reads for a
// run of ev with the run variables vars: the event's fields, and each
// dispatch input's value (a run variable of its name, else its default,
// else "" or false).
func (w *Workflow) CondVars(ev CondEvent, vars []EnvVar) map[string]any {
	m := map[string]any{
		"event.kind":    ev.Kind,
		"event.ref":     ev.Ref,
		"event.branch":  strings.TrimPrefix(ev.Ref, "refs/heads/"),
		"event.tag":     "",
		"event.base":    ev.Base,
		"event.trusted": ev.Trusted,
	}
	switch {
	case strings.HasPrefix(ev.Ref, "refs/heads/"):
	case strings.HasPrefix(ev.Ref, "refs/tags/"):
		m["event.branch"], m["event.tag"] = "", strings.TrimPrefix(ev.Ref, "refs/tags/")
	default:
		m["event.branch"] = ""
	}
	for _, in := range w.Inputs {
		v := ""
		if in.Default != nil {
			v = *in.Default
		}
		for _, rv := range vars {
			if rv.Name == in.Name {
				v = rv.Value
			}
		}
		if in.Type == InputBoolean {
			m["inputs."+in.Name] = v == "true"
		} else {
			m["inputs."+in.Name] = v
		}
	}
	if w.Matrix != nil {
		for _, k := range w.Matrix.Keys {
			m["matrix."+k] = ""
		}
	}
	if w.Leg != nil {
		for _, v := range w.Leg.Values {
			m["matrix."+v.Name] = v.Value
		}
	}
	return m
}

// StepRuns decides whether step i runs: its condition, or success()
// for a step without one.
func (w *Workflow) StepRuns(i int, state State, vars map[string]any) (bool, error) {
	c := w.Steps[i].If
	if c == nil {
		return state == StateSuccess, nil
	}
	return c.Eval(state, vars)
}

// cond reads an if: field, of a step (steps) or of the workflow, with
// the environments envs (made at the first); a problem is an error at
// its place in the file.
func (d *decoder) cond(what string, s scalar, inputs []Input, matrix, outputs []string, envs **condEnvs, steps bool) *Cond {
	if strings.TrimSpace(s.value) == "" {
		d.errorAt(s.tk, "%s: want an expression, got nothing", what)
		return nil
	}
	if *envs == nil {
		e, err := newCondEnvs(inputs, matrix, outputs, steps)
		if err != nil {
			d.errorAt(s.tk, "%s: %v", what, err)
			return nil
		}
		*envs = e
	}
	c, err := (*envs).compile(s.value, inputs)
	if err == nil {
		return c
	}
	ce, ok := err.(*CondError)
	if !ok {
		d.errorAt(s.tk, "%s: %v", what, err)
		return nil
	}
	pos := Position{File: d.file, Line: 1, Column: 1}
	if s.tk != nil && s.tk.Position != nil {
		pos.Line, pos.Column = s.tk.Position.Line, s.tk.Position.Column
	}
	// On a one-line plain or quoted scalar the expression's column is
	// the file's; in a block the place is named within it.
	msg := ce.Msg
	switch {
	case ce.Line == 1 && !strings.Contains(s.value, "\n") && s.tk != nil && s.tk.Type == token.StringType:
		pos.Column += ce.Column
	case ce.Line == 1 && !strings.Contains(s.value, "\n") && s.tk != nil && (s.tk.Type == token.DoubleQuoteType || s.tk.Type == token.SingleQuoteType):
		pos.Column += ce.Column + 1
	case ce.Line >= 1:
		msg = fmt.Sprintf("%s (at line %d, column %d of the expression)", msg, ce.Line, ce.Column+1)
	}
	d.errs = append(d.errs, Error{pos, fmt.Sprintf("%s: %s", what, msg)})
	return nil
}

// condNames are the names a workflow's conditions may read, and their
// functions.
func condNames(inputs []Input, matrix, outputs []string, steps bool) []string {
	var names []string
	for _, v := range condVars {
		names = append(names, v.name)
	}
	for _, in := range inputs {
		names = append(names, "inputs."+in.Name)
	}
	for _, k := range matrix {
		names = append(names, "matrix."+k)
	}
	for _, name := range outputs {
		names = append(names, stepOutputsVar(name))
	}
	if !steps {
		return names
	}
	return append(names, "success()", "failure()", "cancelled()", "always()")
}

// nameAt is the unknown name the checker names (its first part only),
// as written at line (from 1) and column (from 0) of text: the dotted
// name there, or the function called there. Quoted, as it is shown.
func nameAt(text string, line, column int, name string) string {
	lines := strings.Split(text, "\n")
	if line < 1 || line > len(lines) || column < 0 || column > len(lines[line-1]) {
		return strconv.Quote(name)
	}
	rest := []rune(lines[line-1][column:])
	if len(rest) > 0 && rest[0] == '(' {
		return strconv.Quote(name + "()")
	}
	n := 0
	for n < len(rest) && (rest[n] == '_' || rest[n] == '.' || unicode.IsLetter(rest[n]) || unicode.IsDigit(rest[n])) {
		n++
	}
	if written := string(rest[:n]); strings.HasPrefix(written, name) {
		return strconv.Quote(written)
	}
	return strconv.Quote(name)
}

// Holds decides the workflow's if for the event ev with the run
// variables vars (a dispatch's inputs): true for a workflow without one.
func (w *Workflow) Holds(ev CondEvent, vars []EnvVar) (bool, error) {
	if w.If == nil {
		return true, nil
	}
	ok, err := w.If.Eval(StateSuccess, w.CondVars(ev, vars))
	if err != nil {
		return false, fmt.Errorf("workflow %s: %w", w.Name, err)
	}
	return ok, nil
}
