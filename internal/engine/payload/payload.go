// Package payload builds the POSIX sh text that starts a step.
//
// Every executor runs a step by feeding this text to `sh` on the step's
// stdin, so variable and secret values never appear in an argv, in a
// container or Job spec, or in a file: they exist only in the text on the
// pipe and then in the environment of the step's own shell.
package payload

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Var is one exported variable.
type Var struct {
	Name  string
	Value string
}

// Step is what a payload starts.
type Step struct {
	// Env holds the run's plain variables.
	Env []Var
	// Secrets holds the values granted to this step only.
	Secrets []Var
	// Dir is the working directory of the step.
	Dir string
	// Script is the path of the step's script inside the session.
	Script string
}

var validName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Quote returns s as one single-quoted sh word; each single quote in s
// closes the quoting, is escaped with a backslash and reopens it. Newlines
// and every other byte are kept as they are; sh reads them literally
// between single quotes.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Build returns the payload text. It fails on a variable name that sh
// cannot export and on a NUL byte, which no sh string can carry, naming
// the variable.
func Build(s Step) (string, error) {
	var b strings.Builder
	b.WriteString("set -e\n")
	for _, group := range [][]Var{s.Env, s.Secrets} {
		vars := append([]Var(nil), group...)
		sort.SliceStable(vars, func(i, j int) bool { return vars[i].Name < vars[j].Name })
		for _, v := range vars {
			if !validName.MatchString(v.Name) {
				return "", fmt.Errorf("variable %q: not a valid shell variable name", v.Name)
			}
			if strings.IndexByte(v.Value, 0) >= 0 {
				return "", fmt.Errorf("variable %s: value contains a NUL byte", v.Name)
			}
			fmt.Fprintf(&b, "export %s=%s\n", v.Name, Quote(v.Value))
		}
	}
	if s.Dir != "" {
		fmt.Fprintf(&b, "cd %s\n", Quote(s.Dir))
	}
	fmt.Fprintf(&b, "exec sh -e %s\n", Quote(s.Script))
	return b.String(), nil
}

// Masked returns the payload with every secret value replaced by ***, for
// --dry-run and logs.
func Masked(s Step) (string, error) {
	m := s
	m.Secrets = make([]Var, len(s.Secrets))
	for i, v := range s.Secrets {
		m.Secrets[i] = Var{Name: v.Name, Value: "***"}
	}
	if _, err := Build(s); err != nil {
		return "", err
	}
	return Build(m)
}
