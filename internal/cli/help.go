package cli

import (
	"strings"

	"github.com/alecthomas/kong"
)

// Every default shows in --help, and docs/reference/cli.md lists the
// same ones (TestReferenceDefaults): a flag's default is its default
// tag, shown as "(default: X)" after its help, or, when the code
// computes it at start, said in its help as "(default: …)" in words.

// helpValue is the help text of a flag or argument with its default
// shown, unless the help says it itself.
func helpValue(v *kong.Value) string {
	h := kong.DefaultHelpValueFormatter(v)
	d, ok := tagDefault(v)
	if !ok || saysDefault(h) {
		return h
	}
	suffix := "(default: " + d + ")"
	if strings.HasSuffix(h, ".") {
		return h[:len(h)-1] + " " + suffix + "."
	}
	return strings.TrimSpace(h + " " + suffix)
}

// tagDefault is the default tag of v, when it has one worth showing (a
// switch that is off is not).
func tagDefault(v *kong.Value) (string, bool) {
	if !v.HasDefault || v.Default == "" {
		return "", false
	}
	if v.IsBool() && v.Default == "false" {
		return "", false
	}
	return v.Default, true
}

// saysDefault reports whether help states a default itself.
func saysDefault(help string) bool { return strings.Contains(help, "(default") }

// computedDefault is the default a help text states in words, the
// inside of its "(default: …)" (or "(default …)"), and whether it has
// one.
func computedDefault(help string) (string, bool) {
	i := strings.Index(help, "(default")
	if i < 0 {
		return "", false
	}
	rest := help[i+len("(default"):]
	rest = strings.TrimPrefix(strings.TrimPrefix(rest, ":"), " ")
	depth := 0
	for j, r := range rest {
		switch r {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				return strings.TrimSpace(rest[:j]), true
			}
			depth--
		}
	}
	return strings.TrimSpace(rest), true
}

// placeholders names the value of every flag that has a default by its
// kind (DURATION, N, auto|text|…) rather than by the default itself,
// which the help's "(default: X)" shows: `--poll=DURATION … (default:
// 1m)`, not `--poll=1m … (default: 1m)`. It changes the model kong
// built, after its variables are in place.
func placeholders(app *kong.Application) {
	_ = kong.Visit(app, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok && f.HasDefault && f.PlaceHolder == "" && !f.IsBool() && !f.IsCounter() {
			f.PlaceHolder = kindOf(f)
		}
		return next(nil)
	})
}

// kindOf is the placeholder kong gives a flag without a default.
func kindOf(f *kong.Flag) string {
	if f.Enum != "" {
		return strings.ReplaceAll(f.Enum, ",", "|")
	}
	plain := *f
	value := *f.Value
	value.HasDefault = false
	plain.Value = &value
	ph := plain.FormatPlaceHolder()
	if f.IsSlice() && f.Tag.Sep != -1 && f.Tag.Type == "" {
		ph = strings.TrimSuffix(ph, string(f.Tag.Sep)+"...")
	}
	if ph == "INT" || ph == "INT-64" {
		return "N"
	}
	return ph
}
