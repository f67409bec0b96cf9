// Package caplog keeps a run log within a size cap: the head and the tail
// are kept and the cut between them is marked.
package caplog

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// DefaultMax is the cap of a run log, the largest blob a check carries
// (the log's maxSize in lexicons/dev/knotless/check.json).
const DefaultMax = 1 << 20

// markerFormat marks the cut in the middle of a log.
const markerFormat = "\n[knotless-run: %d bytes cut from the middle of this log]\n"

// MarkerRoom is the most bytes the cut marker takes: the content of a
// Buffer is capped that much below its max, so the log with the marker
// stays within max.
const MarkerRoom = len(markerFormat) - len("%d") + len("9223372036854775807") // math.MaxInt64

// Buffer is an io.Writer that keeps at most max bytes, the cut marker
// included: the first half of the content cap as written and the last
// bytes in a ring.
type Buffer struct {
	mu      sync.Mutex
	max     int // of the content: the cap less MarkerRoom
	head    []byte
	tail    []byte // ring of capacity max-len(head)
	start   int    // index of the oldest byte in tail once it wrapped
	wrapped bool
	total   int64
}

// New returns a Buffer whose Bytes are at most max bytes long, the cut
// marker included; max is raised to MarkerRoom+2 if it is below.
func New(max int) *Buffer {
	return &Buffer{max: content(max)}
}

// content is the content cap of a Buffer of cap n.
func content(n int) int {
	return max(n-MarkerRoom, 2)
}

// Split says how a Buffer of cap max divides what it keeps of a log: its
// first head bytes, as written, and its last tail bytes. A stream that
// keeps the same bytes of a log as a Buffer of cap max does keeps these.
func Split(max int) (head, tail int) {
	c := content(max)
	return c / 2, c - c/2
}

// Resume returns a Buffer of cap max that goes on with a log of which
// total bytes were written and kept is what Bytes returned, as if it had
// been written all along (a run handed over to another process): its
// head is kept's, and new bytes go to the tail. Bytes of a log that was
// cut in the middle come out with the marker counting all the bytes cut.
// It fails when kept is not what a Buffer of cap max keeps of total
// bytes.
func Resume(max int, kept []byte, total int64) (*Buffer, error) {
	b := New(max)
	if total == int64(len(kept)) {
		_, _ = b.Write(kept)
		return b, nil
	}
	head, tail, err := Parse(max, kept, total)
	if err != nil {
		return nil, fmt.Errorf("resume log: %w", err)
	}
	b.head = append([]byte(nil), head...)
	b.tail = append(make([]byte, 0, len(tail)), tail...)
	b.total = total
	return b, nil
}

// Parse finds the cut marker in kept, what a Buffer of cap max kept of
// a log of total bytes that it cut in the middle, and returns the head
// and the tail around it: the first and the last bytes of the log.
func Parse(max int, kept []byte, total int64) (head, tail []byte, err error) {
	c := content(max)
	// The head is c/2 bytes, less a character the cut split.
	for h := c / 2; h >= 0 && h >= c/2-(utf8.UTFMax-1); h-- {
		if h > len(kept) {
			continue
		}
		rest := kept[h:]
		prefix, suffix, _ := strings.Cut(markerFormat, "%d")
		if !bytes.HasPrefix(rest, []byte(prefix)) {
			continue
		}
		digits, after, found := bytes.Cut(rest[len(prefix):], []byte(suffix))
		if !found {
			continue
		}
		cut, err := strconv.ParseInt(string(digits), 10, 64)
		if err != nil || cut <= 0 || string(digits) != strconv.FormatInt(cut, 10) {
			continue
		}
		if int64(h)+cut+int64(len(after)) == total && len(after) <= c-c/2 {
			return kept[:h], after, nil
		}
	}
	return nil, nil, fmt.Errorf("%d bytes kept are not what a log of cap %d keeps of %d bytes", len(kept), max, total)
}

// Write never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// The head takes bytes while it holds all the log: not once a
	// resumed log is cut.
	headAll := b.total == int64(len(b.head))
	b.total += int64(len(p))
	n := len(p)
	if room := b.max/2 - len(b.head); room > 0 && headAll {
		k := min(room, len(p))
		b.head = append(b.head, p[:k]...)
		p = p[k:]
	}
	ringCap := b.max - b.max/2
	for len(p) > 0 {
		if !b.wrapped && len(b.tail) < ringCap {
			k := min(ringCap-len(b.tail), len(p))
			b.tail = append(b.tail, p[:k]...)
			p = p[k:]
			continue
		}
		b.wrapped = true
		if len(p) >= ringCap {
			copy(b.tail, p[len(p)-ringCap:])
			b.start = 0
			return n, nil
		}
		k := copy(b.tail[b.start:], p)
		p = p[k:]
		b.start = (b.start + k) % ringCap
	}
	return n, nil
}

// Bytes returns the kept log; when bytes were cut, a line in the middle
// says how many. The cut falls between characters: a UTF-8 character
// that it would split is cut whole, so valid UTF-8 stays valid.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	tail := append(append([]byte(nil), b.tail[b.start:]...), b.tail[:b.start]...)
	return Join(b.head, tail, b.total)
}

// Join is the log kept of a stream of total bytes whose first bytes are
// head and whose last bytes are tail: the two together when nothing is
// between them, else with a line between them saying how many bytes were
// cut. The cut falls between characters: a UTF-8 character that it
// would split is cut whole, so valid UTF-8 stays valid.
func Join(head, tail []byte, total int64) []byte {
	if total == int64(len(head)+len(tail)) {
		return append(append(make([]byte, 0, len(head)+len(tail)), head...), tail...)
	}
	head = head[:runeCut(head)]
	skip := 0 // continuation bytes of a character whose start was cut
	for skip < len(tail) && skip < utf8.UTFMax-1 && !utf8.RuneStart(tail[skip]) {
		skip++
	}
	tail = tail[skip:]
	out := make([]byte, 0, len(head)+MarkerRoom+len(tail))
	out = append(out, head...)
	out = fmt.Appendf(out, markerFormat, total-int64(len(head)+len(tail)))
	return append(out, tail...)
}

// runeCut returns where p may be cut so that no UTF-8 character is
// split: len(p), or the start of a character left incomplete at its
// end. Bytes that are not UTF-8 are cut anywhere.
func runeCut(p []byte) int {
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				return i
			}
			return len(p)
		}
	}
	return len(p)
}

// Total is the number of bytes written, kept or not.
func (b *Buffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}
