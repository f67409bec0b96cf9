// Package mask hides secret values in a stream of log output.
package mask

import (
	"bytes"
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
	values  [][]byte // longest first
	pending []byte
}

// NewWriter returns a Writer to out that masks values. Empty values are
// ignored: they cannot be found in output.
//
// A multi-line value is masked whole, also with its line ends written as
// "\n" or as "\r\n", and each of its lines (without its line end) is
// masked on its own too, as GitHub Actions registers each line of a
// multi-line secret: a step that prints one line of a key, or a tool
// that reflows it, does not show that line. Lines that are only
// whitespace are not masked.
func NewWriter(out io.Writer, values []string) *Writer {
	w := &Writer{out: out}
	seen := map[string]bool{}
	add := func(v string) {
		if v == "" || seen[v] {
			return
		}
		seen[v] = true
		w.values = append(w.values, []byte(v))
	}
	for _, v := range values {
		add(v)
		if !strings.ContainsAny(v, "\r\n") {
			continue
		}
		lf := strings.ReplaceAll(v, "\r\n", "\n")
		add(lf)
		add(strings.ReplaceAll(lf, "\n", "\r\n"))
		for _, line := range strings.Split(lf, "\n") {
			line = strings.TrimSuffix(line, "\r")
			if strings.TrimSpace(line) != "" {
				add(line)
			}
		}
	}
	sort.SliceStable(w.values, func(i, j int) bool { return len(w.values[i]) > len(w.values[j]) })
	return w
}

// Write masks p and writes what is decided. It reports len(p) on success.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.values) == 0 {
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
	for _, v := range w.values {
		if bytes.HasPrefix(buf, v) {
			return v
		}
	}
	return nil
}

// couldStart reports whether buf is a proper prefix of a value, so more
// input could complete a match.
func (w *Writer) couldStart(buf []byte) bool {
	for _, v := range w.values {
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
