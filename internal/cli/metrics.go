package cli

import (
	"github.com/prometheus/client_golang/prometheus"

	"knotless.dev/run/internal/observe/metrics"
	"knotless.dev/run/internal/observe/telemetry"
)

// MetricsFlags say where serve tells what it does besides its journal
// and its status socket.
type MetricsFlags struct {
	MetricsListen string `help:"Serve the runner's Prometheus metrics at http://ADDR/metrics (and the status document at /status) on ADDR (HOST:PORT), e.g. 127.0.0.1:9465. No authentication: keep it on loopback or firewalled. Off when empty." placeholder:"ADDR"`
}

// telemetry makes serve's metrics on a registry of their own (none
// without --metrics-listen) and the executor's observer, which tells
// them what the executor does and keeps its credentials' expiry for
// the status.
func (f *MetricsFlags) telemetry() (telemetry.Config, *telemetry.Executor, error) {
	var m *metrics.Metrics
	if f.MetricsListen != "" {
		var err error
		if m, err = metrics.New(prometheus.NewRegistry()); err != nil {
			return telemetry.Config{}, nil, err
		}
	}
	obs := &telemetry.Executor{M: m}
	return telemetry.Config{Metrics: m, Credentials: obs.Credentials}, obs, nil
}
