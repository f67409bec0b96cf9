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

// TestResume: a log handed over at any byte and resumed from what the
// first Buffer kept and its total comes out as one Buffer writing the
// whole log would have kept it, the cut marker included.
func TestResume(t *testing.T) {
	t.Parallel()
	logs := []string{
		"0123456789abcdefghijklmnopqrstuvwxyz",
		"aé€x€€yz😀bcdé😀😀€efghé",
		strings.Repeat("line\n", 9),
	}
	for _, max := range []int{MarkerRoom + 4, MarkerRoom + 7, MarkerRoom + 12} {
		for _, log := range logs {
			for k := 0; k <= len(log); k++ {
				whole := New(max)
				_, _ = whole.Write([]byte(log))
				first := New(max)
				_, _ = first.Write([]byte(log[:k]))
				b, err := Resume(max, first.Bytes(), first.Total())
				if err != nil {
					t.Fatalf("cap %d, %q handed over at %d: %v", max, log, k, err)
				}
				// Byte by byte, as a step's output may come.
				for i := k; i < len(log); i++ {
					_, _ = b.Write([]byte{log[i]})
				}
				if diff := cmp.Diff(string(whole.Bytes()), string(b.Bytes())); diff != "" {
					t.Errorf("cap %d, %q handed over at %d (-whole +resumed):\n%s", max, log, k, diff)
				}
				if b.Total() != int64(len(log)) {
					t.Errorf("cap %d, handed over at %d: total %d, want %d", max, k, b.Total(), len(log))
				}
			}
		}
	}
}

func TestResumeRefusesAnotherLog(t *testing.T) {
	t.Parallel()
	b := New(MarkerRoom + 6)
	_, _ = b.Write([]byte("0123456789"))
	if _, err := Resume(MarkerRoom+6, b.Bytes(), b.Total()+1); err == nil {
		t.Error("resumed a log with the wrong total")
	}
	if _, err := Resume(MarkerRoom+20, b.Bytes(), b.Total()); err == nil {
		t.Error("resumed a log cut at another cap")
	}
}

// TestSplitJoin: Split names the bytes a Buffer keeps, and Join of them
// is Bytes.
func TestSplitJoin(t *testing.T) {
	t.Parallel()
	log := []byte(strings.Repeat("abcé€", 40))
	for _, limit := range []int{MarkerRoom + 5, MarkerRoom + 50, 1000} {
		b := New(limit)
		_, _ = b.Write(log)
		h, tl := Split(limit)
		h = min(h, len(log))
		head, tail := log[:h], log[max(len(log)-tl, h):]
		if diff := cmp.Diff(string(b.Bytes()), string(Join(head, tail, int64(len(log))))); diff != "" {
			t.Errorf("cap %d (-Bytes +Join):\n%s", limit, diff)
		}
	}
}
