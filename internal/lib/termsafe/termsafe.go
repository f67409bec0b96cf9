// Package termsafe makes strangers' text safe to show on the operator's
// terminal. Workflow and step names, repository names, error strings
// and run logs are written by whoever pushes to a repository the runner
// serves; printed raw, an escape sequence in one acts on the terminal
// that shows it: OSC 52 sets the clipboard, others retitle the window,
// clear or rewrite the screen, or make a line say what it does not.
//
// Line and Text escape a string for display, so that what was written
// is what is seen: every control character (C0, DEL, C1), the bidi
// controls, and bytes that are not UTF-8 are shown as visible escapes
// (\x1b, \u202e, \xff). A backslash is not escaped: the result is for
// reading, not for decoding back.
//
// Writer filters a log shown on a terminal: text, newlines, tabs and
// colours (SGR) pass; every other escape sequence and control is
// dropped, also when it is split across writes.
//
// JSON escapes, in JSON text, what encoding/json leaves raw of that.
package termsafe

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Line returns s escaped for display on one line: every C0 control
// (newline and tab too), DEL, C1 control (U+0080–U+009F) and bidi
// control (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069) is
// shown as an escape, \x1b or \u202e, and each byte that is not UTF-8
// as \xNN. s without any of them is returned as it is.
func Line(s string) string { return escaped(s, false) }

// Text is Line for a message of several lines (errors.Join's, a
// parser's list): newlines and tabs are kept, and nothing else a
// terminal would act on is.
func Text(s string) string { return escaped(s, true) }

func escaped(s string, lines bool) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if unsafe(r, size, lines) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case !unsafe(r, size, lines):
			b.WriteString(s[i : i+size])
		case r == utf8.RuneError && size == 1, r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
	}
	return b.String()
}

// unsafe reports whether a rune of size bytes must be escaped; lines
// keeps newlines and tabs.
// UnsafeRune returns the first rune of s that a name shown to people may
// not hold: a control (C0, DEL, C1), a bidi control, which can make a
// name read as another (report\u202Etxt.exe), or a byte that is not
// UTF-8 (utf8.RuneError).
func UnsafeRune(s string) (rune, bool) {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if unsafe(r, size, false) {
			return r, true
		}
		i += size
	}
	return 0, false
}

func unsafe(r rune, size int, lines bool) bool {
	switch {
	case r == utf8.RuneError && size == 1:
		return true // not UTF-8
	case r == '\n' || r == '\t':
		return !lines
	case r < 0x20, r == 0x7f:
		return true
	case r < 0x80:
		return false
	default:
		return isC1(r) || isBidi(r)
	}
}

func isC1(r rune) bool { return r >= 0x80 && r <= 0x9f }

// isBidi reports the bidi controls: a terminal that reorders text by
// them would show a line's columns out of order.
func isBidi(r rune) bool {
	switch {
	case r == 0x061c, r == 0x200e, r == 0x200f:
		return true
	case r >= 0x202a && r <= 0x202e:
		return true
	case r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// JSON escapes, in b (JSON text, as encoding/json writes it: UTF-8),
// DEL, the C1 controls and the bidi controls as \uXXXX. encoding/json
// escapes the C0 controls itself but leaves these raw; they can only be
// inside strings, so the document means the same. b without any of them
// is returned as it is.
func JSON(b []byte) []byte {
	i := 0
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		if r == 0x7f || isC1(r) || isBidi(r) {
			break
		}
		i += size
	}
	if i == len(b) {
		return b
	}
	out := append(make([]byte, 0, len(b)+12), b[:i]...)
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		if r == 0x7f || isC1(r) || isBidi(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return out
}
