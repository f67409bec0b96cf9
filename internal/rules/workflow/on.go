package workflow

import (
	"fmt"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
	"github.com/robfig/cron/v3"
)

// cronParser reads the five standard fields and the descriptors
// (@daily, @hourly, …). @every and time zones are refused before it is
// asked: a schedule's ticks are fixed points in UTC, the same for every
// runner and every restart.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseCron reads a schedule's cron expression: five fields (minute,
// hour, day of month, month, day of week) or a descriptor (@yearly,
// @monthly, @weekly, @daily, @hourly), in UTC. @every and TZ= or
// CRON_TZ= prefixes are refused.
func ParseCron(spec string) (cron.Schedule, error) {
	s := strings.TrimSpace(spec)
	switch {
	case strings.HasPrefix(s, "@every"):
		return nil, fmt.Errorf("@every is not a schedule of fixed ticks; write the minutes and hours it runs at")
	case strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ="):
		return nil, fmt.Errorf("a time zone is not supported; schedules are in UTC")
	}
	sched, err := cronParser.Parse(s)
	if err != nil {
		return nil, err
	}
	return sched, nil
}

// on reads the workflow's events: one event, a list of them, or a
// mapping of event to its settings (dispatch: inputs; schedule: cron
// entries). It returns the token of each input's name, for the checks
// that need the whole file.
func (d *decoder) on(v ast.Node, w *Workflow) []*token.Token {
	m, ok := v.(*ast.MappingNode)
	if !ok {
		events := d.strings("on", v)
		if len(events) == 0 {
			d.warnAt(v.GetToken(), "on", "on: no events: this workflow never runs")
		}
		for _, s := range events {
			t := Trigger(s.value)
			switch t {
			case Push, Pull, Batch, Dispatch:
				d.addTrigger(w, t, s.tk)
			case Schedule:
				d.errorAt(s.tk, `on: schedule needs its cron entries: on: {schedule: [{cron: "0 3 * * *"}]}`)
			default:
				d.errorAt(s.tk, "on: unknown event %q (want push, pull, batch, dispatch or schedule)", s.value)
			}
		}
		return nil
	}
	if len(m.Values) == 0 {
		d.warnAt(v.GetToken(), "on", "on: no events: this workflow never runs")
	}
	var inputTokens []*token.Token
	for _, mv := range m.Values {
		ktk := mv.Key.GetToken()
		t := Trigger(ktk.Value)
		val := deref(mv.Value)
		switch t {
		case Push, Pull:
			if !empty(val) {
				d.triggerPaths(t, val, w)
			}
		case Batch:
			if !empty(val) {
				d.errorAt(val.GetToken(), "on.%s: takes no settings, got %s (the branches a workflow runs for are its branches field)", t, kind(val))
			}
		case Dispatch:
			if !empty(val) {
				d.mapping(val, "on.dispatch", map[string]func(string, ast.Node){
					"inputs": func(_ string, v ast.Node) { inputTokens = d.inputs(v, w) },
				})
			}
		case Schedule:
			d.schedule(val, w)
		default:
			d.errorAt(ktk, "on: unknown event %q (want push, pull, batch, dispatch or schedule)", ktk.Value)
			continue
		}
		d.addTrigger(w, t, ktk)
	}
	return inputTokens
}

func (d *decoder) addTrigger(w *Workflow, t Trigger, tk *token.Token) {
	if slices.Contains(w.On, t) {
		d.errorAt(tk, "on: %s is named twice", t)
		return
	}
	w.On = append(w.On, t)
}

// empty reports whether an event's settings are absent: nothing, or an
// empty mapping.
func empty(n ast.Node) bool {
	switch v := n.(type) {
	case nil, *ast.NullNode:
		return true
	case *ast.MappingNode:
		return len(v.Values) == 0
	}
	return false
}

// inputs reads on.dispatch.inputs: a mapping of input name to its type,
// description, default, required and options.
func (d *decoder) inputs(n ast.Node, w *Workflow) []*token.Token {
	m, ok := n.(*ast.MappingNode)
	if !ok {
		d.errorAt(n.GetToken(), "on.dispatch.inputs: want a mapping of name to input, got %s", kind(n))
		return nil
	}
	var tokens []*token.Token
	for _, mv := range m.Values {
		ntk := mv.Key.GetToken()
		in := Input{Name: ntk.Value, Type: InputString, Line: lineOf(ntk)}
		what := "on.dispatch.inputs." + in.Name
		if !shellName.MatchString(in.Name) || strings.HasPrefix(in.Name, "KNOTLESS_") {
			d.errorAt(ntk, "on.dispatch.inputs: %q is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved)", in.Name)
		}
		if slices.ContainsFunc(w.Inputs, func(o Input) bool { return o.Name == in.Name }) {
			d.errorAt(ntk, "on.dispatch.inputs: %q is declared twice", in.Name)
		}
		var typeTk, defaultTk, requiredTk *token.Token
		var optionsNode ast.Node
		var def *scalar
		body := deref(mv.Value)
		if empty(body) {
			// name: (nothing): an optional string input without default.
			body = nil
		}
		if body != nil {
			d.mapping(body, what, map[string]func(string, ast.Node){
				"type": func(k string, v ast.Node) {
					s := d.str(what+"."+k, v)
					in.Type, typeTk = InputType(s.value), s.tk
				},
				"description": func(k string, v ast.Node) { in.Description = d.str(what+"."+k, v).value },
				"default": func(k string, v ast.Node) {
					s := d.str(what+"."+k, v)
					def, defaultTk = &s, s.tk
				},
				"required": func(k string, v ast.Node) {
					b, ok := v.(*ast.BoolNode)
					if !ok {
						d.errorAt(v.GetToken(), "%s.%s: want true or false, got %s", what, k, kind(v))
						return
					}
					in.Required, requiredTk = b.Value, b.GetToken()
				},
				"options": func(k string, v ast.Node) {
					optionsNode = v
					for _, s := range d.strings(what+"."+k, v) {
						if slices.Contains(in.Options, s.value) {
							d.errorAt(s.tk, "%s.options: %q is listed twice", what, s.value)
						}
						in.Options = append(in.Options, s.value)
					}
				},
			})
		}
		switch in.Type {
		case InputString, InputBoolean:
			if optionsNode != nil {
				d.errorAt(optionsNode.GetToken(), "%s.options: only a choice has options", what)
			}
		case InputChoice:
			if len(in.Options) == 0 {
				d.errorAt(ntk, "%s: a choice needs options", what)
			}
		default:
			d.errorAt(typeTk, "%s.type: want string, boolean or choice, got %q", what, in.Type)
		}
		if def != nil {
			v := def.value
			switch {
			case in.Required:
				d.errorAt(requiredTk, "%s: required and default exclude each other (a required input is always given)", what)
			case in.Type == InputBoolean && v != "true" && v != "false":
				d.errorAt(defaultTk, "%s.default: want true or false, got %q", what, v)
			case in.Type == InputChoice && len(in.Options) > 0 && !slices.Contains(in.Options, v):
				d.errorAt(defaultTk, "%s.default: %q is not one of the options (%s)", what, v, strings.Join(in.Options, ", "))
			}
			in.Default = &v
		}
		w.Inputs = append(w.Inputs, in)
		tokens = append(tokens, ntk)
	}
	return tokens
}

// schedule reads on.schedule: a list of {cron: EXPRESSION}, at least
// one, each parsed by the cron parser.
func (d *decoder) schedule(n ast.Node, w *Workflow) {
	seq, ok := n.(*ast.SequenceNode)
	if !ok || len(seq.Values) == 0 {
		d.errorAt(n.GetToken(), `on.schedule: want a list of at least one {cron: "…"}, got %s`, kind(n))
		return
	}
	for i, en := range seq.Values {
		en = deref(en)
		what := fmt.Sprintf("on.schedule[%d]", i)
		var c Cron
		d.mapping(en, what, map[string]func(string, ast.Node){
			"cron": func(k string, v ast.Node) {
				s := d.str(what+"."+k, v)
				c = Cron{Spec: s.value, Line: lineOf(s.tk)}
				if _, err := ParseCron(s.value); err != nil {
					d.errorAt(s.tk, "%s.cron: bad cron expression %q: %v", what, s.value, err)
				}
			},
		}, "cron")
		if c.Spec != "" {
			w.Schedule = append(w.Schedule, c)
		}
	}
}

func lineOf(tk *token.Token) int {
	if tk == nil || tk.Position == nil {
		return 1
	}
	return tk.Position.Line
}
