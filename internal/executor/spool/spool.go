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
	return NewAt(0)
}

// NewAt returns an empty Spool whose first byte is at offset: a follower
// that picks a stream up again starts where the old one stopped.
func NewAt(offset int64) *Spool {
	return &Spool{base: offset, wake: make(chan struct{})}
}

// Len is the offset just past the last byte written.
func (s *Spool) Len() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.base + int64(len(s.buf))
}

// WaitLen blocks until at least n bytes were written in all, the spool is
// closed, or ctx ends.
func (s *Spool) WaitLen(ctx context.Context, n int64) error {
	for {
		s.mu.Lock()
		have, closed, wake := s.base+int64(len(s.buf)), s.closed, s.wake
		s.mu.Unlock()
		if have >= n || closed {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
	}
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

// FollowUntil follows the output to w and then waits for done, the signal
// of the step's owner that its exit is known: every executor's
// FollowStep is this, then the exit it recorded.
func (s *Spool) FollowUntil(ctx context.Context, offset int64, w io.Writer, done <-chan struct{}) error {
	if _, err := s.Follow(ctx, offset, w); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
