package spool

import (
	"bytes"
	"context"
	"testing"
	"time"
)

func TestFollowFromOffsetAndDrop(t *testing.T) {
	t.Parallel()
	s := New()
	_, _ = s.Write([]byte("hello "))
	go func() {
		time.Sleep(10 * time.Millisecond)
		_, _ = s.Write([]byte("world"))
		_ = s.Close()
	}()
	var b bytes.Buffer
	end, err := s.Follow(context.Background(), 2, &b)
	if err != nil || end != 11 || b.String() != "llo world" {
		t.Fatalf("Follow = %d, %v, %q; want 11, nil, %q", end, err, b.String(), "llo world")
	}
	if _, err := s.Follow(context.Background(), 0, &b); err == nil {
		t.Error("Follow from a dropped offset succeeded")
	}
}

func TestFollowStopsWithContext(t *testing.T) {
	t.Parallel()
	s := New()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Follow(ctx, 0, &bytes.Buffer{}); err != context.DeadlineExceeded {
		t.Errorf("Follow on open spool = %v, want deadline exceeded", err)
	}
}

func TestFollowUntilWaitsForTheOwner(t *testing.T) {
	t.Parallel()
	s := New()
	done := make(chan struct{})
	_, _ = s.Write([]byte("out"))
	_ = s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	var b bytes.Buffer
	if err := s.FollowUntil(ctx, 0, &b, done); err != context.DeadlineExceeded || b.String() != "out" {
		t.Errorf("FollowUntil before the owner is done = %v, %q; want deadline exceeded after the output", err, b.String())
	}
	close(done)
	if err := s.FollowUntil(context.Background(), 3, &b, done); err != nil || b.String() != "out" {
		t.Errorf("FollowUntil after the owner is done = %v, %q", err, b.String())
	}
}
