package workflow

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"knotless.dev/run/internal/lib/quantity"
	"knotless.dev/run/internal/rules/class"
)

var (
	shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	stepRef   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// Load reads and validates the workflow file at name.
func Load(name string) (*Workflow, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read workflow: %w", err)
	}
	return Parse(name, data)
}

// Parse validates data as the workflow file named file. The workflow's
// name is the file stem. On failure the error is an Errors with every
// problem found, each with its line and column.
func Parse(file string, data []byte) (*Workflow, error) {
	d := &decoder{file: file}
	w := &Workflow{Name: strings.TrimSuffix(filepath.Base(file), filepath.Ext(file)), File: file, Superseded: "cancel"}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		var se *yaml.SyntaxError
		if errors.As(err, &se) && se.Token != nil {
			d.errorAt(se.Token, "%s", se.Message)
		} else {
			d.errs = append(d.errs, Error{Position{file, 1, 1}, err.Error()})
		}
		return nil, d.errs
	}
	if len(f.Docs) != 1 || f.Docs[0].Body == nil {
		return nil, Errors{{Position{file, 1, 1}, "want exactly one YAML document with the workflow"}}
	}
	d.workflow(f.Docs[0].Body, w)
	if len(d.errs) > 0 {
		return nil, d.errs
	}
	w.Warnings = d.warnings
	return w, nil
}

type decoder struct {
	file     string
	errs     Errors
	warnings []Warning
	// stepConds are the steps' conditions' environments, made at the
	// first step's if: (after the inputs are read).
	stepConds *condEnvs
	// matrixTk is where the matrix's errors point.
	matrixTk *token.Token
}

func (d *decoder) errorAt(tk *token.Token, format string, args ...any) {
	pos := Position{File: d.file, Line: 1, Column: 1}
	if tk != nil && tk.Position != nil {
		pos.Line, pos.Column = tk.Position.Line, tk.Position.Column
	}
	d.errs = append(d.errs, Error{pos, fmt.Sprintf(format, args...)})
}

// mapping reads a mapping, calling the reader of each known key, and
// reports unknown keys, duplicates and missing required keys.
func (d *decoder) mapping(n ast.Node, what string, fields map[string]func(key string, v ast.Node), required ...string) {
	n = deref(n)
	m, ok := n.(*ast.MappingNode)
	if !ok {
		d.errorAt(tokenOf(n), "%s: want a mapping, got %s", what, kind(n))
		return
	}
	seen := map[string]bool{}
	for _, mv := range m.Values {
		key := mv.Key.GetToken().Value
		if seen[key] {
			d.errorAt(mv.Key.GetToken(), "%s: duplicate field %q", what, key)
			continue
		}
		seen[key] = true
		read, ok := fields[key]
		switch {
		case ok:
			read(key, deref(mv.Value))
		case key == "branches" && (what == "on.push" || what == "on.pull"):
			d.errorAt(mv.Key.GetToken(), `%s: unknown field "branches": the branches a workflow runs for are its branches field (known here: paths, paths-ignore)`, what)
		case key == "outputs" && what == "workflow":
			d.errorAt(mv.Key.GetToken(), `unknown field "outputs": a step writes its outputs to the directory $KNOTLESS_RUN_OUTPUTS`)
		default:
			d.errorAt(mv.Key.GetToken(), "%s: unknown field %q (known: %s)", what, key, strings.Join(sortedKeys(fields), ", "))
		}
	}
	for _, r := range required {
		if !seen[r] {
			d.errorAt(tokenOf(n), "%s: missing field %q", what, r)
		}
	}
}

// warnAt notes a field that parses but is not acted on.
func (d *decoder) warnAt(tk *token.Token, field, format string, args ...any) {
	pos := Position{File: d.file, Line: 1, Column: 1}
	if tk != nil && tk.Position != nil {
		pos.Line, pos.Column = tk.Position.Line, tk.Position.Column
	}
	d.warnings = append(d.warnings, Warning{pos, field, fmt.Sprintf(format, args...)})
}

func (d *decoder) workflow(n ast.Node, w *Workflow) {
	var stepsNode, servicesNode ast.Node
	var ifScalar *scalar
	var groupTmpl scalar
	var inputTokens []*token.Token
	// refs are the scalars a matrix value may be substituted in (image,
	// env, runners), checked once the matrix is known.
	var refs []subRef
	d.mapping(n, "workflow", map[string]func(string, ast.Node){
		"on": func(k string, v ast.Node) { inputTokens = d.on(v, w) },
		"branches": func(k string, v ast.Node) {
			for _, s := range d.strings(k, v) {
				if _, err := path.Match(s.value, ""); err != nil {
					d.errorAt(s.tk, "branches: bad glob %q: %v", s.value, err)
				}
				w.Branches = append(w.Branches, s.value)
			}
		},
		"image": func(k string, v ast.Node) {
			s := d.str(k, v)
			w.Image = s.value
			refs = append(refs, subRef{"image", s})
		},
		"matrix": func(k string, v ast.Node) { d.matrix(v, w) },
		"runners": func(k string, v ast.Node) {
			for _, s := range d.strings(k, v) {
				refs = append(refs, subRef{"runners", s})
				if !strings.HasPrefix(s.value, "did:") && !strings.Contains(s.value, "${{") {
					d.errorAt(s.tk, "runners: %q is not a DID (want did:plc:… or did:web:…)", s.value)
				}
				w.Runners = append(w.Runners, s.value)
			}
		},
		"timeout": func(k string, v ast.Node) { w.Timeout = d.duration(k, v) },
		"env": func(k string, v ast.Node) {
			m, ok := v.(*ast.MappingNode)
			if !ok {
				d.errorAt(v.GetToken(), "env: want a mapping of NAME: value, got %s", kind(v))
				return
			}
			for _, mv := range m.Values {
				name := mv.Key.GetToken().Value
				if !shellName.MatchString(name) || strings.HasPrefix(name, "KNOTLESS_") {
					d.errorAt(mv.Key.GetToken(), "env: %q is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved)", name)
				}
				s := d.str("env."+name, deref(mv.Value))
				refs = append(refs, subRef{"env." + name, s})
				w.Env = append(w.Env, EnvVar{name, s.value})
			}
		},
		"secrets": func(k string, v ast.Node) { w.Secrets = d.names(k, v) },
		"cache": func(k string, v ast.Node) {
			for _, s := range d.strings(k, v) {
				if s.value == "" || slices.Contains(strings.Split(s.value, "/"), "..") {
					d.errorAt(s.tk, "cache: %q must be a path without ..", s.value)
				}
				w.Cache = append(w.Cache, s.value)
			}
		},
		"artifacts": func(k string, v ast.Node) {
			before := len(d.errs)
			entries := d.strings(k, v)
			typeErrs := len(d.errs) > before
			for _, s := range entries {
				if s.value == "" && typeErrs {
					continue // not a string, said already
				}
				if err := CheckArtifact(s.value); err != nil {
					d.errorAt(s.tk, "artifacts: %q: %v", s.value, err)
				}
				w.Artifacts = append(w.Artifacts, s.value)
			}
		},
		"queue": func(k string, v ast.Node) {
			s := d.str(k, v)
			if s.value != "first" {
				d.errorAt(s.tk, "queue: want first, got %q", s.value)
			}
			w.Queue = s.value
		},
		"concurrency": func(k string, v ast.Node) { groupTmpl = d.concurrency(w, k, v) },
		"superseded": func(k string, v ast.Node) {
			s := d.str(k, v)
			if s.value != "cancel" && s.value != "finish" {
				d.errorAt(s.tk, "superseded: want cancel or finish, got %q", s.value)
			}
			w.Superseded = s.value
		},
		"class": func(k string, v ast.Node) {
			s := d.str(k, v)
			if strings.Contains(s.value, "${{") {
				// Each leg's class is checked once the matrix is known.
				refs = append(refs, subRef{"class", s})
			} else if err := class.ValidName(s.value); err != nil {
				d.errorAt(s.tk, "class: %v", err)
			}
			w.Class = s.value
		},
		"resources": func(k string, v ast.Node) {
			d.mapping(v, "resources", map[string]func(string, ast.Node){
				"cpu":    func(k string, v ast.Node) { w.Resources.CPU = d.quantity("resources."+k, v) },
				"memory": func(k string, v ast.Node) { w.Resources.Memory = d.quantity("resources."+k, v) },
			})
		},
		"if": func(k string, v ast.Node) {
			s := d.str(k, v)
			ifScalar = &s
		},
		"needs":    func(k string, v ast.Node) { d.needs(w, k, v) },
		"retry":    func(k string, v ast.Node) { d.retry(v, w) },
		"steps":    func(k string, v ast.Node) { stepsNode = v },
		"services": func(k string, v ast.Node) { servicesNode = v },
	}, "on", "steps")
	d.matrixUses(w, refs)
	if w.Concurrency != nil {
		d.concurrencyRefs(w, groupTmpl)
	}
	if servicesNode != nil {
		// After secrets: no service may name one.
		d.services(servicesNode, w)
	}
	if ifScalar != nil {
		// After on: its inputs are names the condition reads.
		var envs *condEnvs
		w.If = d.cond("if", *ifScalar, w.Inputs, w.matrixKeys(), nil, &envs, false)
	}
	// An input reaches the steps as a variable of its name: a granted
	// secret's name would be shadowed by it.
	for i, in := range w.Inputs {
		if slices.Contains(w.Secrets, in.Name) {
			d.errorAt(inputTokens[i], "on.dispatch.inputs: %q is a secret the workflow grants; an input of that name would stand beside it", in.Name)
		}
	}
	if stepsNode != nil {
		d.steps(stepsNode, w)
	}
}

func (d *decoder) steps(n ast.Node, w *Workflow) {
	seq, ok := n.(*ast.SequenceNode)
	if !ok || len(seq.Values) == 0 {
		d.errorAt(n.GetToken(), "steps: want a list of at least one step, got %s", kind(n))
		return
	}
	names := map[string]bool{}
	ahead := stepNames(seq)
	outputSteps := outputSteps(ahead)
	for i, sn := range seq.Values {
		sn = deref(sn)
		s := Step{Line: tokenOf(sn).Position.Line}
		var nameTk, ifTk *token.Token
		d.mapping(sn, fmt.Sprintf("steps[%d]", i), map[string]func(string, ast.Node){
			"name": func(k string, v ast.Node) {
				ss := d.str(k, v)
				s.Name, nameTk = ss.value, ss.tk
			},
			"run":     func(k string, v ast.Node) { s.Run = d.str(k, v).value },
			"image":   func(k string, v ast.Node) { s.Image = d.str(k, v).value },
			"uses":    func(k string, v ast.Node) { s.Uses = d.str(k, v).value },
			"timeout": func(k string, v ast.Node) { s.Timeout = d.duration(k, v) },
			"if": func(k string, v ast.Node) {
				ifS := d.str(k, v)
				s.If, ifTk = d.cond(fmt.Sprintf("steps[%d].if", i), ifS, w.Inputs, w.matrixKeys(), outputSteps, &d.stepConds, true), ifS.tk
			},
			"env": func(k string, v ast.Node) {
				var reads bool
				s.Env, reads = d.stepEnv(i, v, w, ahead)
				s.ReadsOutputs = s.ReadsOutputs || reads
			},
			"continue-on-error": func(k string, v ast.Node) {
				b, ok := v.(*ast.BoolNode)
				if !ok {
					d.errorAt(v.GetToken(), "steps[%d].continue-on-error: want true or false, got %s", i, kind(v))
					return
				}
				s.ContinueOnError = b.Value
			},
			"working-directory": func(k string, v ast.Node) {
				ss := d.str(k, v)
				dir, err := workingDirectory(ss.value)
				if err != nil {
					d.errorAt(ss.tk, "steps[%d].working-directory: %q: %v", i, ss.value, err)
				}
				s.WorkingDirectory = dir
			},
			"secrets": func(k string, v ast.Node) {
				s.Secrets = d.names(k, v)
				for _, name := range s.Secrets {
					if !slices.Contains(w.Secrets, name) {
						d.errorAt(v.GetToken(), "steps[%d].secrets: %q is not granted by the workflow's secrets", i, name)
					}
				}
			},
		})
		if s.If != nil && len(s.If.Outputs) > 0 {
			d.checkCondOutputs(i, s.If, ifTk, ahead)
			s.ReadsOutputs = true
		}
		switch {
		case s.Run == "" && s.Uses == "":
			d.errorAt(tokenOf(sn), "steps[%d]: want run or uses", i)
		case s.Run != "" && s.Uses != "":
			d.errorAt(tokenOf(sn), "steps[%d]: run and uses exclude each other", i)
		case s.Uses != "" && !stepRef.MatchString(s.Uses):
			d.errorAt(tokenOf(sn), "steps[%d].uses: %q must name a file in %s (letters, digits, . _ -)", i, s.Uses, StepsDir)
		}
		if s.Name == "" {
			s.Name = fmt.Sprintf("step %d", i+1)
			if s.Uses != "" {
				s.Name = s.Uses
			}
		}
		if names[s.Name] {
			d.errorAt(nameTk, "steps[%d].name: %q is used by an earlier step", i, s.Name)
		}
		names[s.Name] = true
		w.Steps = append(w.Steps, s)
	}
}

// workingDirectory checks a step's working-directory: a path relative
// to the checkout that stays in it. It returns the path cleaned, "" for
// the checkout itself.
func workingDirectory(dir string) (string, error) {
	switch {
	case dir == "":
		return "", errors.New("want a directory relative to the checkout, got nothing")
	case path.IsAbs(dir):
		return "", errors.New("must be relative to the checkout, not absolute")
	case slices.Contains(strings.Split(dir, "/"), ".."):
		return "", errors.New("must stay in the checkout: no .. in it")
	case strings.ContainsAny(dir, "\x00\n"):
		return "", errors.New("holds a NUL byte or a newline")
	}
	dir = path.Clean(dir)
	if dir == "." {
		return "", nil
	}
	return dir, nil
}

type scalar struct {
	value string
	tk    *token.Token
}

// str reads a scalar as text; numbers and booleans are taken as written.
func (d *decoder) str(what string, n ast.Node) scalar {
	switch v := n.(type) {
	case *ast.StringNode:
		return scalar{v.Value, v.GetToken()}
	case *ast.LiteralNode:
		return scalar{v.Value.Value, v.GetToken()}
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
		return scalar{n.GetToken().Value, n.GetToken()}
	}
	d.errorAt(n.GetToken(), "%s: want a string, got %s", what, kind(n))
	return scalar{tk: n.GetToken()}
}

// strings reads one scalar or a list of scalars.
func (d *decoder) strings(what string, n ast.Node) []scalar {
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		return []scalar{d.str(what, n)}
	}
	out := make([]scalar, 0, len(seq.Values))
	for _, v := range seq.Values {
		out = append(out, d.str(what, deref(v)))
	}
	return out
}

// names reads a list of variable names.
func (d *decoder) names(what string, n ast.Node) []string {
	var out []string
	for _, s := range d.strings(what, n) {
		if !shellName.MatchString(s.value) {
			d.errorAt(s.tk, "%s: %q is not a variable name (letters, digits, _)", what, s.value)
		}
		out = append(out, s.value)
	}
	return out
}

func (d *decoder) duration(what string, n ast.Node) time.Duration {
	s := d.str(what, n)
	t, err := time.ParseDuration(s.value)
	if err != nil || t <= 0 {
		d.errorAt(s.tk, "%s: want a positive duration like 90s or 10m, got %q", what, s.value)
	}
	return t
}

func (d *decoder) quantity(what string, n ast.Node) string {
	s := d.str(what, n)
	if q, err := quantity.Parse(s.value); err != nil || q.Sign() <= 0 {
		d.errorAt(s.tk, "%s: want a positive quantity like 500m, 2 or 4Gi, got %q", what, s.value)
	}
	return s.value
}

// deref follows anchors, aliases and tags to the value they stand for.
func deref(n ast.Node) ast.Node {
	for range 32 {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			n = v.Value
		default:
			return n
		}
	}
	return n
}

// tokenOf is where an error about n points: a mapping's first key, not
// its first colon.
func tokenOf(n ast.Node) *token.Token {
	if m, ok := n.(*ast.MappingNode); ok && len(m.Values) > 0 {
		return m.Values[0].Key.GetToken()
	}
	return n.GetToken()
}

func kind(n ast.Node) string {
	switch n.(type) {
	case *ast.MappingNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.NullNode, nil:
		return "nothing"
	case *ast.AliasNode:
		return "an alias (aliases are not supported)"
	default:
		return fmt.Sprintf("%q", n.GetToken().Value)
	}
}

func sortedKeys(m map[string]func(string, ast.Node)) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
