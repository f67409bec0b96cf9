package cli

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"golang.org/x/term"
)

// tcell is one table tcell: its text (already escaped for the terminal)
// and the SGR colour it is shown in ("" none).
type tcell struct {
	text   string
	colour string
}

// table is columns padded to their widest tcell, fit to the terminal's
// width by cutting the columns in shrink (widest first) with "…".
type table struct {
	head   []string
	rows   [][]tcell
	shrink []int
}

// print writes the table; width 0 is no bound (not a terminal).
func (t *table) print(w io.Writer, width int) {
	widths := make([]int, len(t.head))
	for i, h := range t.head {
		widths[i] = utf8.RuneCountInString(h)
	}
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c.text))
		}
	}
	if width > 0 {
		total := func() int {
			n := 2 * (len(widths) - 1)
			for _, w := range widths {
				n += w
			}
			return n
		}
		for total() > width {
			widest := -1
			for _, i := range t.shrink {
				if widths[i] > 8 && (widest < 0 || widths[i] > widths[widest]) {
					widest = i
				}
			}
			if widest < 0 {
				break
			}
			widths[widest]--
		}
	}
	line := func(cells []tcell) {
		var b strings.Builder
		for i, c := range cells {
			text := fit(c.text, widths[i])
			pad := widths[i] - utf8.RuneCountInString(text)
			if c.colour != "" {
				text = "\x1b[" + c.colour + "m" + text + "\x1b[0m"
			}
			b.WriteString(text)
			if i < len(cells)-1 {
				b.WriteString(strings.Repeat(" ", pad+2))
			}
		}
		fmt.Fprintln(w, b.String())
	}
	head := make([]tcell, len(t.head))
	for i, h := range t.head {
		head[i] = tcell{text: h}
	}
	line(head)
	for _, r := range t.rows {
		line(r)
	}
}

// fit cuts s to n runes, the last one "…".
func fit(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// terminalWidth is w's width when it is a terminal, else 0.
func terminalWidth(w io.Writer) int {
	if !terminal(w) {
		return 0
	}
	if f, ok := w.(interface{ Fd() uintptr }); ok {
		if width, _, err := term.GetSize(int(f.Fd())); err == nil {
			return width
		}
	}
	if s, ok := w.(interface{ Width() int }); ok {
		return s.Width()
	}
	return 0
}

// useColour: colours only on a terminal, and never with NO_COLOR set
// (no-color.org).
func useColour(env *Env) bool {
	return terminal(env.Stdout) && (env.Getenv == nil || env.Getenv("NO_COLOR") == "")
}

// statusColour is the SGR colour of a check's status.
func statusColour(status string, on bool) string {
	if !on {
		return ""
	}
	switch status {
	case "success":
		return "32"
	case "failure", "error":
		return "31"
	case "queued", "running":
		return "33"
	}
	return "2"
}
