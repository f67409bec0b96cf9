package latency

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/tests/pds"
)

// farHost is the loopback address the accounts' DID documents name for
// a PDS started far away (startFarPDS): the daemon
// reaches it there, through farLink, while the test's own writes go to
// the PDS directly.
const farHost = "127.0.0.2"

// farLink forwards every connection to from (HOST:PORT) to to, and
// delivers each chunk of bytes, either way, oneWay after it was read: a
// link of 2*oneWay round trip, such as to a hosted PDS. A new
// connection's first bytes wait one round trip more, its TCP handshake.
// It returns the address it listens on, and stops, closing every
// connection, when tb ends.
func farLink(tb testing.TB, from, to string, oneWay time.Duration) string {
	tb.Helper()
	ln, err := net.Listen("tcp", from)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	tb.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { linkConn(ctx, c, to, oneWay) })
		}
	})
	return ln.Addr().String()
}

// linkConn forwards c to a new connection to to, each way delayed by
// oneWay, until both ways have ended or ctx is done.
func linkConn(ctx context.Context, c net.Conn, to string, oneWay time.Duration) {
	defer c.Close()
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", to)
	if err != nil {
		return
	}
	defer up.Close()
	handshake := time.Now().Add(2 * oneWay)
	var wg sync.WaitGroup
	wg.Go(func() { delayed(ctx, up, c, oneWay, handshake) })
	wg.Go(func() { delayed(ctx, c, up, oneWay, handshake) })
	stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
	defer stop()
	wg.Wait()
}

// chunk is bytes read from one end, due at the other at due.
type chunk struct {
	data []byte
	due  time.Time
}

// delayed copies src to dst, each chunk written oneWay after it was
// read, or after notBefore when read earlier (a connection's first
// bytes wait for its handshake), then half-closes dst.
func delayed(ctx context.Context, dst, src net.Conn, oneWay time.Duration, notBefore time.Time) {
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				sent := time.Now()
				if sent.Before(notBefore) {
					sent = notBefore
				}
				due := sent.Add(oneWay)
				select {
				case chunks <- chunk{buf[:n], due}:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range chunks {
		if wait := time.Until(ch.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if _, err := dst.Write(ch.data); err != nil {
			src.Close() // ends the reader above
			for range chunks {
			}
			return
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// startFarPDS starts a PDS of the benchmark's own whose DID documents
// name it at farHost, through a link of rtt round trip to it.
func startFarPDS(tb testing.TB, rtt time.Duration) *pds.Server {
	tb.Helper()
	srv := startPDSWith(tb, pds.Options{PublicHost: farHost})
	pub, err := url.Parse(srv.PublicURL)
	if err != nil {
		tb.Fatal(err)
	}
	farLink(tb, pub.Host, net.JoinHostPort("127.0.0.1", pub.Port()), rtt/2)
	return srv
}

// TestFarLink: what goes through farLink arrives whole and in order,
// each way no sooner than oneWay after it was sent (a new connection's
// first bytes one round trip later still), and a half-close reaches
// the other end.
func TestFarLink(t *testing.T) {
	const oneWay = 20 * time.Millisecond
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		c, err := echo.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	addr := farLink(t, "127.0.0.1:0", echo.Addr().String(), oneWay)

	sent := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	exchange := func(msg []byte) time.Duration {
		t.Helper()
		start := time.Now()
		go func() { _, _ = c.Write(msg) }()
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("echo through the link differs from what was sent (%d bytes)", len(msg))
		}
		return time.Since(start)
	}
	exchange([]byte("first"))
	if d := time.Since(sent); d < 4*oneWay {
		t.Errorf("a new connection's first exchange took %v from the dial, want at least %v (handshake and a round trip)", d, 4*oneWay)
	}
	big := make([]byte, 1<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	if d := exchange(big); d < 2*oneWay {
		t.Errorf("a round trip took %v, want at least %v", d, 2*oneWay)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The echo server sees the end, ends its copy and closes: so does
	// the link's other way.
	if n, err := io.Copy(io.Discard, c); err != nil || n != 0 {
		t.Fatalf("after a half-close: read %d bytes, err %v; want the end", n, err)
	}
}
