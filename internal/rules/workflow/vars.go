package workflow

import (
	"fmt"
	"slices"
	"strings"
)

// The bounds on a run's variables (a re-run's env, a dispatch's
// inputs): they travel in every step's payload, so they are few and
// small.
const (
	// MaxRunVars is how many variables a run may be given.
	MaxRunVars = 64
	// MaxRunVarBytes bounds the names and values of a run's variables
	// together, in bytes.
	MaxRunVarBytes = 32 << 10
)

// VarError is a run variable refused, naming it.
type VarError struct {
	Name, Reason string
}

func (e *VarError) Error() string { return fmt.Sprintf("run variable %q: %s", e.Name, e.Reason) }

// CheckRunVars checks the variables given to a run from outside its
// workflow file: a re-run's env or a dispatch's inputs. Each name is a
// shell name, not KNOTLESS_* (the runner's own), not one of secrets (the
// names the workflow grants; nil when the workflow is not known yet),
// and given once; no value holds a NUL byte; there are at most
// MaxRunVars of them and MaxRunVarBytes of names and values. The error
// is a *VarError naming the first variable refused.
func CheckRunVars(vars []EnvVar, secrets []string) error {
	seen := map[string]bool{}
	size := 0
	for i, v := range vars {
		refuse := func(format string, args ...any) error {
			return &VarError{Name: v.Name, Reason: fmt.Sprintf(format, args...)}
		}
		switch {
		case i >= MaxRunVars:
			return refuse("a run takes at most %d variables", MaxRunVars)
		case !shellName.MatchString(v.Name):
			return refuse("not a shell variable name (letters, digits and _, not starting with a digit)")
		case strings.HasPrefix(v.Name, "KNOTLESS_"):
			return refuse("KNOTLESS_ is reserved for the runner's variables")
		case slices.Contains(secrets, v.Name):
			return refuse("the workflow grants a secret of that name")
		case seen[v.Name]:
			return refuse("given twice")
		case strings.IndexByte(v.Value, 0) >= 0:
			return refuse("the value holds a NUL byte")
		}
		seen[v.Name] = true
		size += len(v.Name) + len(v.Value)
		if size > MaxRunVarBytes {
			return refuse("a run's variables take at most %d bytes of names and values", MaxRunVarBytes)
		}
	}
	return nil
}

// InputError is a dispatch input refused, naming it.
type InputError struct {
	Workflow, Name, Reason string
}

func (e *InputError) Error() string {
	return fmt.Sprintf("workflow %s: input %q: %s", e.Workflow, e.Name, e.Reason)
}

// DispatchVars checks the inputs a dispatch gives against the workflow's
// declared inputs and returns the variables the run gets, in the
// workflow's order: each given value, else the default; an optional
// input with neither is left unset. An unknown input, one given twice,
// a missing required one, a boolean other than true or false and a
// choice not among its options are refused with an *InputError; the
// result must then pass CheckRunVars (a *VarError).
func (w *Workflow) DispatchVars(given []EnvVar) ([]EnvVar, error) {
	byName := map[string]string{}
	for _, g := range given {
		refuse := func(format string, args ...any) error {
			return &InputError{Workflow: w.Name, Name: g.Name, Reason: fmt.Sprintf(format, args...)}
		}
		i := slices.IndexFunc(w.Inputs, func(in Input) bool { return in.Name == g.Name })
		if i < 0 {
			known := make([]string, len(w.Inputs))
			for j, in := range w.Inputs {
				known[j] = in.Name
			}
			if len(known) == 0 {
				return nil, refuse("the workflow declares no inputs")
			}
			return nil, refuse("not an input of the workflow (known: %s)", strings.Join(known, ", "))
		}
		if _, dup := byName[g.Name]; dup {
			return nil, refuse("given twice")
		}
		in := w.Inputs[i]
		switch {
		case in.Type == InputBoolean && g.Value != "true" && g.Value != "false":
			return nil, refuse("want true or false, got %q", g.Value)
		case in.Type == InputChoice && !slices.Contains(in.Options, g.Value):
			return nil, refuse("%q is not one of the options (%s)", g.Value, strings.Join(in.Options, ", "))
		}
		byName[g.Name] = g.Value
	}
	var vars []EnvVar
	for _, in := range w.Inputs {
		v, ok := byName[in.Name]
		switch {
		case ok:
		case in.Required:
			return nil, &InputError{Workflow: w.Name, Name: in.Name, Reason: "required, and not given"}
		case in.Default != nil:
			v = *in.Default
		default:
			continue
		}
		vars = append(vars, EnvVar{Name: in.Name, Value: v})
	}
	if err := CheckRunVars(vars, w.Secrets); err != nil {
		return nil, err
	}
	return vars, nil
}
