package mask

import (
	"bytes"
	"encoding/base64"
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

func b64(s string) string    { return base64.StdEncoding.EncodeToString([]byte(s)) }
func b64url(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) }

// A value's base64 forms are masked, those of each line of a multi-line
// value too: alone, inside a longer encoded text at each offset, in the
// URL alphabet. Forms of values shorter than minEncoded are not.
func TestWriterMasksBase64(t *testing.T) {
	t.Parallel()
	key := "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END KEY-----\n"
	line := "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
	tests := []struct {
		name   string
		values []string
		in     string
		leaked []string // none of these may be in the output
		want   string   // when not empty, the whole output
	}{
		{"a value's encoding", []string{"hunter22"}, "x=" + b64("hunter22") + ".", nil, "x=***."},
		{"a value's URL encoding", []string{"\xfb\xff\xfe-secret"}, b64url("\xfb\xff\xfe-secret"), []string{b64url("\xfb\xff\xfe-secret")}, "***"},
		{"a multi-line value's encoding", []string{key}, b64(key), []string{b64(key)}, "***"},
		{"a multi-line value's encoding, with crlf", []string{key}, b64(strings.ReplaceAll(key, "\n", "\r\n")), nil, "***"},
		{"one line's encoding", []string{key}, "line=" + b64(line) + "\n", nil, "line=***\n"},
		{"one line inside a longer encoding, offset 0", []string{key}, b64("abc" + line + "xyz"), []string{b64(line)[:8]}, ""},
		{"one line inside a longer encoding, offset 1", []string{key}, b64("a" + line + "xyz"), []string{b64("a" + line)[4:12]}, ""},
		{"one line inside a longer encoding, offset 2", []string{key}, b64("ab" + line + "xyz"), []string{b64("ab" + line)[4:12]}, ""},
		{"a short value's encoding is kept", []string{"pw1"}, b64("pw1") + " pw1", nil, b64("pw1") + " ***"},
		{"a short line's encoding is kept", []string{"user\nlonger-line"}, b64("user") + " " + b64("longer-line"), nil, b64("user") + " ***"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			w := NewWriter(&b, tt.values)
			// Byte by byte: the forms are held back like the values.
			for i := range len(tt.in) {
				_, _ = w.Write([]byte{tt.in[i]})
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			got := b.String()
			if tt.want != "" {
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("masked output (-want +got):\n%s", diff)
				}
			}
			for _, l := range tt.leaked {
				if strings.Contains(got, l) {
					t.Errorf("%q leaked in %q", l, got)
				}
			}
			if !strings.Contains(got, Replacement) {
				t.Errorf("nothing masked in %q", got)
			}
		})
	}
}

func FuzzWriterNeverLeaks(f *testing.F) {
	f.Add("secret", "xxsecretyy", 3)
	f.Add("secret-value", "x="+b64("ab secret-value yz"), 5)
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
		if len(value) >= minEncoded {
			for _, e := range encodings(value) {
				if strings.Contains(b.String(), e) {
					t.Fatalf("value %q leaked as %q in %q", value, e, b.String())
				}
			}
		}
	})
}
