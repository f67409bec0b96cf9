package checks

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A check's error is cut to the lexicon's maxLength in bytes; a cut in
// the middle of a character would make the record invalid.
func TestTruncateKeepsValidUTF8(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		n    int
		want string
	}{
		{"short", "ok", 10, "ok"},
		{"ascii", "abcdefghij", 8, "abcde..."},
		{"euro across the cut", "ab€cdef", 6, "ab..."}, // € is bytes 2..4
		{"euro ends at the cut", "abc€defgh", 9, "abc€..."},
		{"long multibyte", strings.Repeat("é", 2000), 3000, strings.Repeat("é", 1498) + "..."},
		{"invalid bytes", "a\xffb", 10, "a\uFFFDb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Truncate(tt.in, tt.n)
			if got != tt.want {
				t.Errorf("Truncate(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
			}
			if len(got) > tt.n || !utf8.ValidString(got) {
				t.Errorf("Truncate(%q, %d) = %q: %d bytes, valid UTF-8 %v", tt.in, tt.n, got, len(got), utf8.ValidString(got))
			}
		})
	}
}
