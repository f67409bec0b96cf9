package run

import (
	"strings"
	"testing"
)

// TestTailBuffer: the tail keeps the last lines written since its
// reset, at most tailLines of them and tailBytes bytes, never a line
// cut at its front.
func TestTailBuffer(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 3*tailBytes)
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
	}{
		{"nothing", nil, ""},
		{"an unended line", []string{"a\nb"}, "a\nb"},
		{"trailing newlines", []string{"a\n", "b\n\n"}, "a\nb"},
		{"more lines than kept", []string{strings.Repeat("l\n", 20), "last\n"}, strings.Repeat("l\n", tailLines-1) + "last"},
		{"a line longer than kept, then lines", []string{long, "\nend 1\nend 2\n"}, "end 1\nend 2"},
		{"one line longer than kept", []string{long}, long[:tailBytes]},
		{"bytes cut mid-rune", []string{strings.Repeat("é", tailBytes) + "z"}, "\uFFFD" + strings.Repeat("é", tailBytes/2-1) + "z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var tb tailBuffer
			tb.Write([]byte("before the reset\n"))
			tb.reset()
			for _, w := range tc.writes {
				tb.Write([]byte(w))
			}
			if got := tb.String(); got != tc.want {
				t.Errorf("tail %q, want %q", trim(got), trim(tc.want))
			}
		})
	}
}

func trim(s string) string {
	if len(s) > 40 {
		return s[:20] + "…" + s[len(s)-20:]
	}
	return s
}
