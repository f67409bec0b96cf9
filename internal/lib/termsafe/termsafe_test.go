package termsafe

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

const osc52 = "\x1b]52;c;cm0gLXJmIH4K\x07"

func TestLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
	}{
		{"build", "build"},
		{"", ""},
		{"héllo wörld ✓ 日本", "héllo wörld ✓ 日本"},
		{"step" + osc52, `step\x1b]52;c;cm0gLXJmIH4K\x07`},
		{"a\x1b[2Jb", `a\x1b[2Jb`},
		{"a\x1b[31mred", `a\x1b[31mred`}, // a name has no colours
		{"two\nlines\ttab\rcr", `two\x0alines\x09tab\x0dcr`},
		{"nul\x00del\x7f", `nul\x00del\x7f`},
		{"c1 \u009b2J \u0085", `c1 \u009b2J \u0085`},
		{"bidi \u202eevil\u202c \u2066x\u2069 \u200e\u200f\u061c", `bidi \u202eevil\u202c \u2066x\u2069 \u200e\u200f\u061c`},
		{"bad \xff\xc3 utf8", `bad \xff\xc3 utf8`},
		{"\x9b raw C1 byte", `\x9b raw C1 byte`},
		{"a real \ufffd stays", "a real \ufffd stays"},
		{`back\slash`, `back\slash`},
	} {
		if got := Line(tc.in); got != tc.want {
			t.Errorf("Line(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
	}{
		{"one\ntwo\tthree", "one\ntwo\tthree"},
		{"err: " + osc52 + "\nnext\r", `err: \x1b]52;c;cm0gLXJmIH4K\x07` + "\nnext\\x0d"},
		{"\u202e\x00", `\u202e\x00`},
	} {
		if got := Text(tc.in); got != tc.want {
			t.Errorf("Text(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	v := map[string]string{"workflow": "x\x1b]52;c;QQ==\x07\u009b\u202e\x7f ok"}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	got := JSON(b)
	if want := `{"workflow":"x\u001b]52;c;QQ==\u0007\u009b\u202e\u007f ok"}`; string(got) != want {
		t.Errorf("JSON = %s, want %s", got, want)
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || back["workflow"] != v["workflow"] {
		t.Errorf("JSON changed the document: %q %v", back, err)
	}
	plain := []byte(`{"a":"b"}`)
	if got := JSON(plain); &got[0] != &plain[0] {
		t.Error("JSON copied a document with nothing to escape")
	}
}

// filter writes each of parts through a Writer and flushes it.
func filter(t *testing.T, parts ...string) string {
	t.Helper()
	var out bytes.Buffer
	w := NewWriter(&out)
	for _, p := range parts {
		if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

var writerCases = []struct {
	name, in, want string
}{
	{"text", "hello\n\tworld ✓\n", "hello\n\tworld ✓\n"},
	{"colours pass", "\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold\x1b[m\n", "\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold\x1b[m\n"},
	{"OSC 52 clipboard (BEL)", "a" + osc52 + "b\n", "ab\n"},
	{"OSC 52 clipboard (ST)", "a\x1b]52;c;cm0gLXJmIH4K\x1b\\b\n", "ab\n"},
	{"OSC 8 hyperlink", "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\\n", "click\n"},
	{"OSC title left open ends at the line", "a\x1b]0;title\nb\n", "a\nb\n"},
	{"clear screen and home", "\x1b[2J\x1b[Hx\x1b[3J\n", "x\n"},
	{"erase line and cursor moves", "\x1b[2K\x1b[1G\x1b[5A\x1b[10;20Hx\n", "x\n"},
	{"private modes", "\x1b[?1049h\x1b[?25lx\x1b[?1000h\n", "x\n"},
	{"SGR with colon sub-parameters dropped", "\x1b[38:2::255:0:0mx\n", "x\n"},
	{"SGR with an intermediate dropped", "\x1b[1 mx\n", "x\n"},
	{"DCS", "a\x1bPq#0;2;0;0;0\x1b\\b", "ab"},
	{"APC PM SOS", "a\x1b_apc\x1b\\b\x1b^pm\x07c\x1bXsos\x1b\\d", "abcd"},
	{"reset and charset", "a\x1bcb\x1b(0c\x1b#8d\x1b7e\x1b8", "abcde"},
	{"bare ESC before text", "a\x1b\x01b", "ab"},
	{"ESC ESC [ m", "\x1b\x1b[1mx", "\x1b[1mx"},
	{"CAN cancels", "\x1b[31\x18m", "m"},
	{"control inside a CSI ends it", "\x1b[3\n1mx", "\n1mx"},
	{"C0 controls dropped", "a\x07b\x08c\x0bd\x0ce\x00f\x0eg\x0fh\x7fi", "abcdefghi"},
	{"lone CR is a newline", "10%\r20%\rdone\n", "10%\n20%\ndone\n"},
	{"CRLF is one newline", "a\r\nb\r\n", "a\nb\n"},
	{"CR CR LF", "a\r\r\nb", "a\n\nb"},
	{"C1 controls dropped", "a\u009b2Jb\u009d52;c;QQ==\u009cc\u0085d", "a2Jb52;c;QQ==cd"},
	{"raw C1 bytes are not UTF-8", "a\x9b2Jb", "a\ufffd2Jb"},
	{"invalid UTF-8", "a\xffb\xc3(c", "a\ufffdb\ufffd(c"},
	{"bidi passes", "\u202eabc\u202c\n", "\u202eabc\u202c\n"},
	{"overlong SGR dropped", "\x1b[" + strings.Repeat("1;", 100) + "mx", "x"},
	{"unfinished sequence at the end", "a\x1b[31", "a"},
	{"unfinished character at the end", "a\xe2\x9c", "a\ufffd"},
}

func TestWriter(t *testing.T) {
	t.Parallel()
	for _, tc := range writerCases {
		if got := filter(t, tc.in); got != tc.want {
			t.Errorf("%s: %q gives %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
}

// TestWriterSplit: an input split at any point, or written a byte at a
// time, gives what it gives in one write.
func TestWriterSplit(t *testing.T) {
	t.Parallel()
	for _, tc := range writerCases {
		for i := range len(tc.in) + 1 {
			if got := filter(t, tc.in[:i], tc.in[i:]); got != tc.want {
				t.Errorf("%s split at %d: %q+%q gives %q, want %q", tc.name, i, tc.in[:i], tc.in[i:], got, tc.want)
			}
		}
		var bytes []string
		for i := range len(tc.in) {
			bytes = append(bytes, tc.in[i:i+1])
		}
		if got := filter(t, bytes...); got != tc.want {
			t.Errorf("%s a byte at a time: gives %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestWriterError: the underlying writer's error is returned.
func TestWriterError(t *testing.T) {
	t.Parallel()
	w := NewWriter(failWriter{})
	if n, err := w.Write([]byte("x")); n != 0 || err == nil {
		t.Errorf("Write to a failing writer: %d, %v", n, err)
	}
	// Nothing to write: no error.
	if n, err := w.Write([]byte("\x1b[2J")); n != 4 || err != nil {
		t.Errorf("Write of nothing shown: %d, %v", n, err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errFail }

var errFail = errors.New("failed")

var sgrOnly = regexp.MustCompile("\x1b\\[[0-9;]*m")

// safeForTerminal says what in out a terminal would act on beyond
// colours, newlines and tabs, or "".
func safeForTerminal(out string) string {
	if !utf8.ValidString(out) {
		return "invalid UTF-8"
	}
	rest := sgrOnly.ReplaceAllString(out, "")
	for _, r := range rest {
		switch {
		case r == '\n' || r == '\t':
		case r < 0x20 || r == 0x7f || isC1(r):
			return "control " + Line(string(r))
		}
	}
	return ""
}

func FuzzWriter(f *testing.F) {
	for _, tc := range writerCases {
		f.Add([]byte(tc.in), uint16(len(tc.in)/2))
	}
	f.Fuzz(func(t *testing.T, in []byte, at uint16) {
		whole := filter(t, string(in))
		if why := safeForTerminal(whole); why != "" {
			t.Fatalf("%q gives %q: %s", in, whole, why)
		}
		i := int(at) % (len(in) + 1)
		if split := filter(t, string(in[:i]), string(in[i:])); split != whole {
			t.Fatalf("%q split at %d gives %q, in one write %q", in, i, split, whole)
		}
		// Text that needs no filtering passes as it is.
		if plain := Text(string(in)); plain == string(in) && whole != plain {
			t.Fatalf("plain text %q gives %q", in, whole)
		}
	})
}

func FuzzLine(f *testing.F) {
	for _, tc := range writerCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, got := range map[string]string{"Line": Line(s), "Text": Text(s)} {
			if !utf8.ValidString(got) {
				t.Fatalf("%s(%q) = %q: invalid UTF-8", name, s, got)
			}
			for _, r := range got {
				if (r < 0x20 && !(name == "Text" && (r == '\n' || r == '\t'))) || r == 0x7f || isC1(r) || isBidi(r) {
					t.Fatalf("%s(%q) = %q holds %U", name, s, got, r)
				}
			}
			if safe := !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || isC1(r) || isBidi(r) }) && utf8.ValidString(s); safe && got != s && name == "Line" {
				t.Fatalf("Line(%q) = %q changed a safe string", s, got)
			}
		}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := json.Unmarshal(JSON(b), &back); err != nil {
			t.Fatalf("JSON(%s): %v", b, err)
		}
		var want string
		_ = json.Unmarshal(b, &want)
		if diff := cmp.Diff(want, back); diff != "" {
			t.Fatalf("JSON changed the string (-want +got):\n%s", diff)
		}
	})
}

func TestUnsafeRune(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want rune
		bad  bool
	}{
		{"report.txt", 0, false},
		{"日本/ü.txt", 0, false},
		{"report\u202etxt.exe", 0x202e, true},
		{"a\tb", '\t', true},
		{"a\u009bb", 0x9b, true},
		{"a\x7f", 0x7f, true},
		{"x\xffy", utf8.RuneError, true},
	} {
		if got, bad := UnsafeRune(tt.in); got != tt.want || bad != tt.bad {
			t.Errorf("UnsafeRune(%q) = %U, %v; want %U, %v", tt.in, got, bad, tt.want, tt.bad)
		}
	}
}
