// Package spool holds a step's output between the process that writes it
// and the follower that reads it from a byte offset.
package spool

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// Spool is an in-memory output buffer addressed by absolute byte offsets.
// Bytes that a follower has passed are dropped, so memory stays bounded by
// what is not yet read.
type Spool struct {
	mu     sync.Mutex
	base   int64 // offset of buf[0]
	buf    []byte
	closed bool
	wake   chan struct{}
}

// New returns an empty Spool.
func New() *Spool {
	return &Spool{wake: make(chan struct{})}
}

// Write appends p. It never fails.
func (s *Spool) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, p...)
	s.signal()
	return len(p), nil
}

// Close marks the end of the output.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.signal()
	return nil
}

func (s *Spool) signal() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// Follow copies the output from offset to w until the spool is closed and
// drained, and returns the offset reached. Bytes before the offset it has
// written are dropped.
func (s *Spool) Follow(ctx context.Context, offset int64, w io.Writer) (int64, error) {
	for {
		s.mu.Lock()
		if offset < s.base {
			s.mu.Unlock()
			return offset, fmt.Errorf("output before byte %d is gone (asked for %d)", s.base, offset)
		}
		chunk := append([]byte(nil), s.buf[min(offset-s.base, int64(len(s.buf))):]...)
		closed, wake := s.closed, s.wake
		s.mu.Unlock()
		if len(chunk) > 0 {
			n, err := w.Write(chunk)
			offset += int64(n)
			s.drop(offset)
			if err != nil {
				return offset, err
			}
			continue
		}
		if closed {
			return offset, nil
		}
		select {
		case <-ctx.Done():
			return offset, ctx.Err()
		case <-wake:
		}
	}
}

func (s *Spool) drop(offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := offset - s.base; n > 0 && n <= int64(len(s.buf)) {
		s.buf = append(s.buf[:0:0], s.buf[n:]...)
		s.base = offset
	}
}
