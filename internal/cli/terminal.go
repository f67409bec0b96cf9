package cli

import (
	"io"

	"golang.org/x/term"
)

// terminal reports whether w is a terminal: a file whose descriptor is
// one (os.Stdout on a tty), or a writer that says it is one (a test's).
func terminal(w io.Writer) bool {
	switch t := w.(type) {
	case interface{ Terminal() bool }:
		return t.Terminal()
	case interface{ Fd() uintptr }:
		return term.IsTerminal(int(t.Fd()))
	}
	return false
}
