// Package caplog keeps a run log within a size cap: the head and the tail
// are kept and the cut between them is marked.
package caplog

import (
	"fmt"
	"sync"
)

// DefaultMax is the cap of a run log, the largest blob a check carries.
const DefaultMax = 1 << 20

// Buffer is an io.Writer that keeps at most max bytes: the first half of
// the cap as written and the last bytes in a ring.
type Buffer struct {
	mu      sync.Mutex
	max     int
	head    []byte
	tail    []byte // ring of capacity max-len(head)
	start   int    // index of the oldest byte in tail once it wrapped
	wrapped bool
	total   int64
}

// New returns a Buffer that keeps at most max bytes of content.
func New(max int) *Buffer {
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
// says how many.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := append([]byte(nil), b.head...)
	kept := int64(len(b.head) + len(b.tail))
	if cut := b.total - kept; cut > 0 {
		out = fmt.Appendf(out, "\n[knotless-run: %d bytes cut from the middle of this log]\n", cut)
	}
	out = append(out, b.tail[b.start:]...)
	return append(out, b.tail[:b.start]...)
}

// Total is the number of bytes written, kept or not.
func (b *Buffer) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}
