// Package caplog keeps a run log within a size cap: the head and the tail
// are kept and the cut between them is marked.
package caplog

import (
	"fmt"
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
	max -= MarkerRoom
	if max < 2 {
		max = 2
	}
	return &Buffer{max: max}
}

// Write never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	n := len(p)
	if room := b.max/2 - len(b.head); room > 0 {
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
	if b.total == int64(len(b.head)+len(tail)) {
		return append(b.head[:len(b.head):len(b.head)], tail...)
	}
	head := b.head[:runeCut(b.head)]
	skip := 0 // continuation bytes of a character whose start was cut
	for skip < len(tail) && skip < utf8.UTFMax-1 && !utf8.RuneStart(tail[skip]) {
		skip++
	}
	tail = tail[skip:]
	out := append([]byte(nil), head...)
	out = fmt.Appendf(out, markerFormat, b.total-int64(len(head)+len(tail)))
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
