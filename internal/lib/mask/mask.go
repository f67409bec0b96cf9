// Package mask hides secret values in a stream of log output.
package mask

import (
	"bytes"
	"encoding/base64"
	"io"
	"sort"
	"strings"
	"sync"
)

// Replacement is what a secret value becomes.
const Replacement = "***"

// Writer replaces every secret value written through it with ***. A value
// split across two writes is still caught: the bytes that could begin a
// value are held back until the next write or Flush decides.
type Writer struct {
	mu      sync.Mutex
	out     io.Writer
	set     *Set
	pending []byte
}

// Set is what a Writer masks: the secret values and the forms each is
// also masked in, worked out once and shared by every Writer made from
// it (a run's log, and each of its files that is published). A nil Set
// masks nothing.
type Set struct {
	// first holds the values by their first byte, longest first: a
	// byte of output is compared only with the values it could begin.
	first [256][][]byte
	n     int
}

// minEncoded is the shortest value whose base64 forms are masked: the
// forms of a shorter one are a few characters that ordinary encoded
// text holds by chance.
const minEncoded = 6

// NewSet returns the Set that masks values. Empty values are ignored:
// they cannot be found in output.
//
// A multi-line value is masked whole, also with its line ends written as
// "\n" or as "\r\n", and each of its lines (without its line end) is
// masked on its own too, as GitHub Actions registers each line of a
// multi-line secret: a step that prints one line of a key, or a tool
// that reflows it, does not show that line. Lines that are only
// whitespace are not masked.
//
// Each of those forms of at least minEncoded bytes (the whole value and
// each line) is masked in base64 too, standard and URL alphabets: the
// whole encoding, and the characters its bytes alone decide at each of
// the three offsets it may have in a longer encoded text. Base64 that
// a tool wraps across lines (base64 without -w0 does at 76 characters)
// is not found whole.
func NewSet(values []string) *Set {
	s := &Set{}
	seen := map[string]bool{}
	add := func(v string) {
		if v == "" || seen[v] {
			return
		}
		seen[v] = true
		s.first[v[0]] = append(s.first[v[0]], []byte(v))
		s.n++
	}
	for _, v := range values {
		forms := []string{v}
		if strings.ContainsAny(v, "\r\n") {
			lf := strings.ReplaceAll(v, "\r\n", "\n")
			forms = append(forms, lf, strings.ReplaceAll(lf, "\n", "\r\n"))
			for _, line := range strings.Split(lf, "\n") {
				line = strings.TrimSuffix(line, "\r")
				if strings.TrimSpace(line) != "" {
					forms = append(forms, line)
				}
			}
		}
		for _, f := range forms {
			add(f)
			if len(f) >= minEncoded {
				for _, e := range encodings(f) {
					add(e)
				}
			}
		}
	}
	for i := range s.first {
		sort.SliceStable(s.first[i], func(a, b int) bool { return len(s.first[i][a]) > len(s.first[i][b]) })
	}
	return s
}

// urlAlphabet turns standard base64 into the URL alphabet's.
var urlAlphabet = strings.NewReplacer("+", "-", "/", "_")

// encodings are v's base64 forms: its whole encoding, and for each
// offset k (0, 1, 2) v may start at in a 3-byte group of a longer
// encoded text, the characters only v's bits make (an edge character
// shares bits with the bytes around v and is left out); each in the
// standard and the URL alphabet.
func encodings(v string) []string {
	whole := base64.StdEncoding.EncodeToString([]byte(v))
	out := []string{whole, urlAlphabet.Replace(whole)}
	for k := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, k), v...))
		inner := enc[(8*k+5)/6 : (8*k+8*len(v))/6]
		out = append(out, inner, urlAlphabet.Replace(inner))
	}
	return out
}

// NewWriter returns a Writer to out that masks values (NewSet).
func NewWriter(out io.Writer, values []string) *Writer {
	return NewSet(values).Writer(out)
}

// Writer returns a Writer to out that masks the set's values.
func (s *Set) Writer(out io.Writer) *Writer {
	return &Writer{out: out, set: s}
}

// empty reports whether the set masks nothing.
func (s *Set) empty() bool { return s == nil || s.n == 0 }

// Write masks p and writes what is decided. It reports len(p) on success.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.set.empty() {
		return w.out.Write(p)
	}
	w.pending = append(w.pending, p...)
	out, rest := w.scan(w.pending, false)
	w.pending = append(w.pending[:0], rest...)
	if len(out) > 0 {
		if _, err := w.out.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes the held-back bytes: at the end of the stream they can no
// longer begin a value.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	out, _ := w.scan(w.pending, true)
	w.pending = w.pending[:0]
	if len(out) == 0 {
		return nil
	}
	_, err := w.out.Write(out)
	return err
}

// Discard drops the held-back bytes unwritten and returns how many there
// were. A run handed over to another process calls it instead of Flush:
// the held bytes may be the first half of a secret whose second half
// only the successor reads, so they must not reach the log in clear.
// The successor reads the step's output again from that many bytes
// before where this writer stopped, and masks the value whole.
func (w *Writer) Discard() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(w.pending)
	w.pending = w.pending[:0]
	return n
}

// scan returns the masked bytes that are final and the tail to hold back.
func (w *Writer) scan(buf []byte, final bool) (out, rest []byte) {
	out = make([]byte, 0, len(buf))
	i := 0
	for i < len(buf) {
		// Held first: a value found here may be the start of a longer
		// one (a line of a multi-line value) that more input completes.
		if !final && w.couldStart(buf[i:]) {
			return out, buf[i:]
		}
		if v := w.matchAt(buf[i:]); v != nil {
			out = append(out, Replacement...)
			i += len(v)
			continue
		}
		out = append(out, buf[i])
		i++
	}
	return out, nil
}

// matchAt returns the longest value that buf starts with.
func (w *Writer) matchAt(buf []byte) []byte {
	if w.set.empty() {
		return nil
	}
	for _, v := range w.set.first[buf[0]] {
		if bytes.HasPrefix(buf, v) {
			return v
		}
	}
	return nil
}

// couldStart reports whether buf is a proper prefix of a value, so more
// input could complete a match.
func (w *Writer) couldStart(buf []byte) bool {
	if w.set.empty() {
		return false
	}
	for _, v := range w.set.first[buf[0]] {
		if len(buf) < len(v) && bytes.HasPrefix(v, buf) {
			return true
		}
	}
	return false
}

// String masks s in one go, for text that is not a stream.
func String(s string, values []string) string {
	var b bytes.Buffer
	w := NewWriter(&b, values)
	_, _ = w.Write([]byte(s))
	_ = w.Flush()
	return b.String()
}
