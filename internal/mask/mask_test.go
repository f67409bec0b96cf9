package mask

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWriterMasks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values []string
		writes []string
		want   string
	}{
		{"one write", []string{"hunter2"}, []string{"pw=hunter2!"}, "pw=***!"},
		{"split across writes", []string{"hunter2"}, []string{"pw=hun", "te", "r2 end"}, "pw=*** end"},
		{"longest first", []string{"abc", "abcdef"}, []string{"xabcdefy abc"}, "x***y ***"},
		{"prefix held then released", []string{"secret"}, []string{"sec", "ond"}, "second"},
		{"tail at end is flushed", []string{"secret"}, []string{"the sec"}, "the sec"},
		{"multiline value", []string{"a\nb"}, []string{"x a", "\nb y"}, "x *** y"},
		{"repeated", []string{"k"}, []string{"kkk"}, "*********"},
		{"multiline whole", []string{"line1\nline2"}, []string{"k=line1\nline2."}, "k=***."},
		{"multiline each line", []string{"-----BEGIN KEY-----\nAAAA\n-----END KEY-----\n"}, []string{"-----BEGIN KEY-----\nx\nAAAA\n-----END KEY-----"}, "***\nx\n***\n***"},
		{"multiline one line printed alone", []string{"user\npassw0rd"}, []string{"pw is ", "pass", "w0rd!"}, "pw is ***!"},
		{"multiline blank lines not masked", []string{"a1\n\n  \nb2"}, []string{"x\n\n  \ny a1"}, "x\n\n  \ny ***"},
		{"crlf value printed with crlf", []string{"one\r\ntwo"}, []string{"one\r\ntwo"}, "***"},
		{"crlf value printed with lf", []string{"one\r\ntwo"}, []string{"one\ntwo"}, "***"},
		{"lf value printed with crlf", []string{"one\ntwo"}, []string{"one\r\ntwo"}, "***"},
		{"crlf value one line", []string{"one\r\ntwo"}, []string{"[two]"}, "[***]"},
		{"no values", nil, []string{"plain"}, "plain"},
		{"empty value ignored", []string{""}, []string{"plain"}, "plain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			w := NewWriter(&b, tt.values)
			for _, s := range tt.writes {
				n, err := w.Write([]byte(s))
				if err != nil || n != len(s) {
					t.Fatalf("Write(%q) = %d, %v", s, n, err)
				}
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, b.String()); diff != "" {
				t.Errorf("masked output (-want +got):\n%s", diff)
			}
		})
	}
}

// Every split point of the input must give the same masked output.
func TestWriterEverySplit(t *testing.T) {
	t.Parallel()
	values := []string{"p@ss'w\"ord", "tok"}
	in := "a p@ss'w\"ord b tok c p@ss"
	want := "a *** b *** c p@ss"
	for i := 0; i <= len(in); i++ {
		var b bytes.Buffer
		w := NewWriter(&b, values)
		_, _ = w.Write([]byte(in[:i]))
		_, _ = w.Write([]byte(in[i:]))
		_ = w.Flush()
		if got := b.String(); got != want {
			t.Errorf("split at %d: got %q, want %q", i, got, want)
		}
	}
}

// A stream handed over at any byte: the stopping writer discards what it
// holds, the successor reads again from the offset minus that many
// bytes. Together they log the stream masked, nothing lost, no half of
// a secret in clear.
func TestWriterDiscardAtHandover(t *testing.T) {
	t.Parallel()
	values := []string{"hunter2", "k1\nk2"}
	in := "pw=hunter2 key=k1\nk2 hunt end"
	want := "pw=*** key=*** hunt end"
	for offset := 0; offset <= len(in); offset++ {
		var log bytes.Buffer
		old := NewWriter(&log, values)
		_, _ = old.Write([]byte(in[:offset]))
		resume := offset - old.Discard()
		_ = old.Flush()
		succ := NewWriter(&log, values)
		_, _ = succ.Write([]byte(in[resume:]))
		_ = succ.Flush()
		if got := log.String(); got != want {
			t.Errorf("handover at %d (successor from %d): log %q, want %q", offset, resume, got, want)
		}
	}
}

func FuzzWriterNeverLeaks(f *testing.F) {
	f.Add("secret", "xxsecretyy", 3)
	f.Fuzz(func(t *testing.T, value, in string, split int) {
		if len(value) < 2 || strings.Contains(Replacement, value) || strings.Contains(value, "*") {
			return
		}
		if split < 0 || split > len(in) {
			split = len(in) / 2
		}
		var b bytes.Buffer
		w := NewWriter(&b, []string{value})
		_, _ = w.Write([]byte(in[:split]))
		_, _ = w.Write([]byte(in[split:]))
		_ = w.Flush()
		if strings.Contains(b.String(), value) {
			t.Fatalf("value %q leaked in %q", value, b.String())
		}
	})
}
