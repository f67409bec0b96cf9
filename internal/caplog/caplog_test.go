package caplog

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestBuffer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		max    int
		writes []string
		want   string
	}{
		// max counts the marker: MarkerRoom+6 keeps 6 bytes of content.
		{"under cap", MarkerRoom + 10, []string{"abc", "def"}, "abcdef"},
		{"exactly cap", MarkerRoom + 6, []string{"abcdef"}, "abcdef"},
		{"cut in middle", MarkerRoom + 6, []string{"abc", "defgh", "ij"}, "abc\n[knotless-run: 4 bytes cut from the middle of this log]\nhij"},
		{"one big write", MarkerRoom + 6, []string{"0123456789"}, "012\n[knotless-run: 4 bytes cut from the middle of this log]\n789"},
		{"many small writes", MarkerRoom + 4, strings.Split("abcdefghij", ""), "ab\n[knotless-run: 6 bytes cut from the middle of this log]\nij"},
		// "é" is 2 bytes, "€" 3: the cut takes whole characters.
		{"cut splits characters", MarkerRoom + 6, []string{"ab", "é", "xyz€"}, "ab\n[knotless-run: 5 bytes cut from the middle of this log]\n€"},
		{"cut splits a character at the head", MarkerRoom + 6, []string{"aa€€bb"}, "aa\n[knotless-run: 6 bytes cut from the middle of this log]\nbb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := New(tt.max)
			for _, w := range tt.writes {
				_, _ = b.Write([]byte(w))
			}
			got := b.Bytes()
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("kept log (-want +got):\n%s", diff)
			}
			if len(got) > tt.max || !utf8.Valid(got) {
				t.Errorf("kept %d bytes (cap %d), valid UTF-8 %v", len(got), tt.max, utf8.Valid(got))
			}
		})
	}
}

func TestBufferCapsAMegabyte(t *testing.T) {
	t.Parallel()
	b := New(DefaultMax)
	line := strings.Repeat("x", 99) + "\n"
	for range 30000 {
		_, _ = b.Write([]byte(line))
	}
	got := b.Bytes()
	// The check lexicon's log blob maxSize, the marker included.
	const lexiconMaxSize = 1048576
	if len(got) > lexiconMaxSize || len(got) < lexiconMaxSize-MarkerRoom {
		t.Errorf("kept %d bytes, want at most %d and at least %d", len(got), lexiconMaxSize, lexiconMaxSize-MarkerRoom)
	}
	if b.Total() != 3000000 || !strings.Contains(string(got), "bytes cut from the middle") {
		t.Errorf("total %d, cut marker missing", b.Total())
	}
}
