// Package class holds the operator's resource classes: named bounds
// (CPU, memory, ephemeral storage, processes) and placement (node
// selector, tolerations) a workflow picks with `class:`. It is pure: the
// rules that pick a run's class and clamp its requests, and the parsing
// of the operator's --class flag.
package class

import (
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"knotless.dev/run/internal/lib/quantity"
)

// Default is the name of the class a workflow that names none runs in.
// A runner always has it: the operator's class of that name, or one
// bounding only ephemeral storage (DefaultEphemeralStorage).
const Default = "default"

// DefaultEphemeralStorage bounds the disk of a run whose class sets no
// ephemeral storage of its own, so that a step that fills the node's
// disk has its own pod evicted, and no other.
const DefaultEphemeralStorage = "10Gi"

// Class is one class the operator defines. Its quantities are bounds
// (limits); "" bounds nothing.
type Class struct {
	Name             string
	CPU, Memory      string
	EphemeralStorage string
	// Pids bounds the processes of a run (0: the executor's own
	// bound); only executors with such a bound take it.
	Pids         int64
	NodeSelector map[string]string
	Tolerations  []Toleration
	// Untrusted: runs of pulls (untrusted work) may name the class.
	// The default class is open to them whatever it says.
	Untrusted bool
}

// Toleration is a taint a class's pods tolerate: Key, with Value when
// set (else any value), of Effect.
type Toleration struct {
	Key, Value, Effect string
}

// Set is the runner's classes, by name; it always holds Default.
type Set struct {
	byName map[string]Class
}

// ParseSet is NewSet of the classes specs name, each as Parse reads it.
func ParseSet(specs ...string) (Set, error) {
	cs := make([]Class, 0, len(specs))
	for _, spec := range specs {
		c, err := Parse(spec)
		if err != nil {
			return Set{}, err
		}
		cs = append(cs, c)
	}
	return NewSet(cs)
}

// NewSet returns the set of classes cs. A class that sets no ephemeral
// storage gets the default class's. Two classes of one name are an
// error naming it.
func NewSet(cs []Class) (Set, error) {
	s := Set{byName: map[string]Class{}}
	for _, c := range cs {
		if _, dup := s.byName[c.Name]; dup {
			return Set{}, fmt.Errorf("class %s is defined twice", c.Name)
		}
		s.byName[c.Name] = c
	}
	def, ok := s.byName[Default]
	if !ok {
		def = Class{Name: Default}
	}
	if def.EphemeralStorage == "" {
		def.EphemeralStorage = DefaultEphemeralStorage
	}
	def.Untrusted = true
	s.byName[Default] = def
	for name, c := range s.byName {
		if c.EphemeralStorage == "" {
			c.EphemeralStorage = def.EphemeralStorage
			s.byName[name] = c
		}
	}
	return s, nil
}

// Names are the set's class names, sorted.
func (s Set) Names() []string {
	if s.byName == nil {
		return []string{Default}
	}
	return slices.Sorted(maps.Keys(s.byName))
}

// All are the set's classes, by name.
func (s Set) All() []Class {
	if s.byName == nil {
		s, _ = NewSet(nil)
	}
	var out []Class
	for _, n := range s.Names() {
		out = append(out, s.byName[n])
	}
	return out
}

// Error is a run refused for the class it names: the run ends error.
type Error struct {
	Class string
	// Untrusted: the class exists but is not open to untrusted runs.
	Untrusted bool
	// Names are the classes the run could have named.
	Names []string
}

func (e *Error) Error() string {
	if e.Untrusted {
		return fmt.Sprintf("class %s is not open to untrusted runs (pulls); their classes on this runner: %s", e.Class, strings.Join(e.Names, ", "))
	}
	return fmt.Sprintf("class %s is not one of this runner's classes: %s", e.Class, strings.Join(e.Names, ", "))
}

// Pick returns the class a run that names name runs in ("" is Default),
// or an *Error: a name the runner does not define, or a class not open
// to untrusted work for an untrusted run.
func (s Set) Pick(name string, trusted bool) (Class, error) {
	if s.byName == nil {
		s, _ = NewSet(nil)
	}
	if name == "" {
		name = Default
	}
	c, ok := s.byName[name]
	if !ok {
		return Class{}, &Error{Class: name, Names: s.Names()}
	}
	if !trusted && !c.Untrusted {
		var open []string
		for _, n := range s.Names() {
			if s.byName[n].Untrusted {
				open = append(open, n)
			}
		}
		return Class{}, &Error{Class: name, Untrusted: true, Names: open}
	}
	return c, nil
}

// Clamp bounds a workflow's requests (resources.cpu and
// resources.memory, "" for none) by the class's, and returns what it
// lowered as lines for the run's log. A request that does not read as a
// quantity is replaced by the bound.
func (c Class) Clamp(cpu, memory string) (string, string, []string) {
	var notes []string
	clamp := func(field, want, bound string) string {
		if want == "" || bound == "" {
			return want
		}
		w, err := quantity.Parse(want)
		b, berr := quantity.Parse(bound)
		if berr != nil || (err == nil && w.Cmp(b) <= 0) {
			return want
		}
		notes = append(notes, fmt.Sprintf("resources.%s %s lowered to %s, the bound of class %s", field, want, bound, c.Name))
		return bound
	}
	return clamp("cpu", cpu, c.CPU), clamp("memory", memory, c.Memory), notes
}

// Parse reads one --class flag: NAME:KEY=VALUE,... with the keys cpu,
// memory, ephemeral-storage (quantities), pids (a count),
// node-selector=LABEL=VALUE and toleration=KEY[=VALUE]:EFFECT (each
// repeatable), and untrusted (no value: pulls may name the class).
func Parse(spec string) (Class, error) {
	name, rest, _ := strings.Cut(spec, ":")
	if err := ValidName(name); err != nil {
		return Class{}, fmt.Errorf("--class %q: %w", spec, err)
	}
	c := Class{Name: name}
	if rest == "" {
		return c, nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, hasValue := strings.Cut(kv, "=")
		bad := func(format string, args ...any) (Class, error) {
			return Class{}, fmt.Errorf("--class %s: %s: %s", name, kv, fmt.Sprintf(format, args...))
		}
		if k == "untrusted" {
			if hasValue {
				return bad("untrusted takes no value")
			}
			c.Untrusted = true
			continue
		}
		if !hasValue || v == "" {
			return bad("want KEY=VALUE (keys: cpu, memory, ephemeral-storage, pids, node-selector, toleration, untrusted)")
		}
		switch k {
		case "cpu", "memory", "ephemeral-storage":
			q, err := quantity.Parse(v)
			if err != nil {
				return bad("%v", err)
			}
			if q.Cmp(new(big.Rat)) <= 0 {
				return bad("must be more than 0")
			}
			switch k {
			case "cpu":
				c.CPU = v
			case "memory":
				c.Memory = v
			default:
				c.EphemeralStorage = v
			}
		case "pids":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return bad("want a count above 0")
			}
			c.Pids = n
		case "node-selector":
			lk, lv, ok := strings.Cut(v, "=")
			if !ok || lk == "" {
				return bad("want node-selector=LABEL=VALUE")
			}
			if c.NodeSelector == nil {
				c.NodeSelector = map[string]string{}
			}
			c.NodeSelector[lk] = lv
		case "toleration":
			t, err := ParseToleration(v)
			if err != nil {
				return bad("%v", err)
			}
			c.Tolerations = append(c.Tolerations, t)
		default:
			return bad("unknown key %s (keys: cpu, memory, ephemeral-storage, pids, node-selector, toleration, untrusted)", k)
		}
	}
	return c, nil
}

// ParseToleration reads KEY[=VALUE]:EFFECT.
func ParseToleration(s string) (Toleration, error) {
	i := strings.LastIndex(s, ":")
	if i <= 0 {
		return Toleration{}, fmt.Errorf("toleration %q: want KEY[=VALUE]:EFFECT", s)
	}
	kv, effect := s[:i], s[i+1:]
	switch effect {
	case "NoSchedule", "PreferNoSchedule", "NoExecute":
	default:
		return Toleration{}, fmt.Errorf("toleration %q: effect must be NoSchedule, PreferNoSchedule or NoExecute", s)
	}
	k, v, _ := strings.Cut(kv, "=")
	return Toleration{Key: k, Value: v, Effect: effect}, nil
}

// ValidName reports whether name can name a class: lower-case letters,
// digits and dashes, starting with a letter, at most 63 characters.
func ValidName(name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("class name %q: want 1 to 63 characters", name)
	}
	for i, r := range name {
		letter := r >= 'a' && r <= 'z'
		if !letter && (i == 0 || !(r >= '0' && r <= '9' || r == '-')) {
			return fmt.Errorf("class name %q: want lower-case letters, digits and dashes, starting with a letter", name)
		}
	}
	return nil
}
