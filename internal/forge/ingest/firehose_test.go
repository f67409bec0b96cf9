package ingest

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestFirehoseReconnectsWithoutLeaking: a host that drops every
// connection right after the handshake makes the firehose reconnect
// again and again; the number of goroutines stays flat however many
// times it does.
func TestFirehoseReconnectsWithoutLeaking(t *testing.T) {
	var conns atomic.Int64
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		conns.Add(1)
		_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "bye"), time.Now().Add(time.Second))
		c.Close()
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	fh := &Firehose{Host: srv.URL, Logger: slog.New(slog.DiscardHandler), Backoff: time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- fh.Run(ctx, func(Change) {}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	// goroutinesAfter waits for the n-th connection, then for the
	// goroutines of the earlier ones to wind down, and counts the
	// goroutines that a connection started.
	goroutinesAfter := func(n int64) int {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for conns.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections after 30s, want %d", conns.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		return strings.Count(stacks, "created by knotless.dev/run/internal/forge/ingest.(*Firehose).once")
	}
	before := goroutinesAfter(2)
	after := goroutinesAfter(10)
	if after > before {
		t.Errorf("goroutines started by a connection: %d after 2 connections, %d after 10", before, after)
	}
}
