package caplog

import (
	"strings"
	"testing"

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
		{"under cap", 10, []string{"abc", "def"}, "abcdef"},
		{"exactly cap", 6, []string{"abcdef"}, "abcdef"},
		{"cut in middle", 6, []string{"abc", "defgh", "ij"}, "abc\n[knotless-run: 4 bytes cut from the middle of this log]\nhij"},
		{"one big write", 6, []string{"0123456789"}, "012\n[knotless-run: 4 bytes cut from the middle of this log]\n789"},
		{"many small writes", 4, strings.Split("abcdefghij", ""), "ab\n[knotless-run: 6 bytes cut from the middle of this log]\nij"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := New(tt.max)
			for _, w := range tt.writes {
				_, _ = b.Write([]byte(w))
			}
			if diff := cmp.Diff(tt.want, string(b.Bytes())); diff != "" {
				t.Errorf("kept log (-want +got):\n%s", diff)
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
	if len(got) > DefaultMax+100 {
		t.Errorf("kept %d bytes, want about %d", len(got), DefaultMax)
	}
	if b.Total() != 3000000 || !strings.Contains(string(got), "bytes cut from the middle") {
		t.Errorf("total %d, cut marker missing", b.Total())
	}
}
