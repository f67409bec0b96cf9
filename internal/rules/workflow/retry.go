package workflow

import (
	"strconv"

	"github.com/goccy/go-yaml/ast"
)

// MaxRetries is the most a workflow's retry.max may ask for: a run is
// tried at most MaxRetries+1 times.
const MaxRetries = 5

// RetryWhen says which ends of a run are tried again.
type RetryWhen string

// The values of retry.when.
const (
	// RetryInfrastructure tries again only a run the infrastructure lost
	// (its pod evicted or disrupted, its node gone, its session not
	// started for the cluster's reasons): never a step that failed.
	RetryInfrastructure RetryWhen = "infrastructure"
	// RetryAlways also tries again a run that ended failure or error.
	RetryAlways RetryWhen = "always"
)

// Retry is a workflow's retry: how many more tries a run gets, and
// after which ends.
type Retry struct {
	Max  int
	When RetryWhen
}

// Again reports whether a run that ended after tries tries (1 for the
// first) is tried again: failed says it ended failure or error, lost
// that the infrastructure lost it (an error of the executor's marked
// executor.ErrInfrastructure). A nil Retry never tries again.
func (r *Retry) Again(tries int, failed, lost bool) bool {
	if r == nil || tries > r.Max {
		return false
	}
	switch r.When {
	case RetryAlways:
		return failed || lost
	default:
		return lost
	}
}

// retry reads the workflow's retry: {max: N, when: infrastructure|always}.
func (d *decoder) retry(n ast.Node, w *Workflow) {
	r := &Retry{When: RetryInfrastructure}
	d.mapping(n, "retry", map[string]func(string, ast.Node){
		"max": func(k string, v ast.Node) {
			s := d.str("retry.max", v)
			i, err := strconv.Atoi(s.value)
			if _, isInt := v.(*ast.IntegerNode); !isInt || err != nil || i < 1 || i > MaxRetries {
				d.errorAt(s.tk, "retry.max: want a whole number of retries from 1 to %d, got %q", MaxRetries, s.value)
				return
			}
			r.Max = i
		},
		"when": func(k string, v ast.Node) {
			s := d.str("retry.when", v)
			switch RetryWhen(s.value) {
			case RetryInfrastructure, RetryAlways:
				r.When = RetryWhen(s.value)
			default:
				d.errorAt(s.tk, "retry.when: want infrastructure or always, got %q", s.value)
			}
		},
	}, "max")
	w.Retry = r
}
