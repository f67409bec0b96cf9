package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"knotless.dev/run/internal/observe/metrics"
	"knotless.dev/run/internal/observe/status"
)

// Config is what the daemon tells of itself besides its journal.
type Config struct {
	// Metrics, when set, is told what the parts observe (the engine's and
	// the executor's observers are the caller's to set) and served at
	// Listen.
	Metrics *metrics.Metrics
	// Listen is where Metrics and the status document are served over
	// HTTP ("": nowhere; --metrics-listen).
	Listen string
	// Credentials lists the executor's credentials and their expiry for
	// the status (Executor.Credentials); nil: none known.
	Credentials func() []status.Credential
}

// Servers are the daemon's HTTP listeners: the status socket in its
// state directory, and with a metrics address, the metrics at /metrics
// and the status document at status.Path there too. The metrics name no
// repository; the document does (runs' events, workflows, steps,
// commits, the PDS's errors), so the address, which has no
// authentication, is for the Prometheus host only (the operating
// guide). Each serves from a goroutine of its own until Close, which
// waits for them.
type Servers struct {
	servers []*http.Server
	wg      sync.WaitGroup
}

// Listen listens on the status socket (status.SocketPath of stateDir)
// and, when metricsAddr is set, on metricsAddr (--metrics-listen), and
// serves p's document on both and m's metrics on the second. Nothing is
// left listening when it fails.
func Listen(stateDir, metricsAddr string, m *metrics.Metrics, p status.Provider, log *slog.Logger) (*Servers, error) {
	s := &Servers{}
	sock, err := status.Listen(status.SocketPath(stateDir))
	if err != nil {
		return nil, err
	}
	s.serve(sock, status.Handler(p), log)
	if metricsAddr == "" {
		return s, nil
	}
	l, err := net.Listen("tcp", metricsAddr)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("--metrics-listen %s: %w", metricsAddr, err)
	}
	mux := http.NewServeMux()
	if m != nil {
		mux.Handle("GET /metrics", m.Handler())
	}
	mux.Handle(status.Path, status.Handler(p))
	s.serve(l, mux, log)
	log.Info("serving metrics", "address", "http://"+l.Addr().String()+"/metrics")
	return s, nil
}

func (s *Servers) serve(l net.Listener, h http.Handler, log *slog.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	s.servers = append(s.servers, srv)
	s.wg.Go(func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("status or metrics listener failed", "address", l.Addr().String(), "err", err)
		}
	})
}

// Close stops the listeners (a request going on gets a few seconds to
// end) and waits for their goroutines. The status socket is removed.
func (s *Servers) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range s.servers {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	}
	s.wg.Wait()
}
