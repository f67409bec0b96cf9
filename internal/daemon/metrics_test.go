package daemon_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/observe/metrics"
)

// withMetrics gives a daemon metrics on a registry of the test's, and
// reads back the value of a series (a counter's or gauge's; 0 when it
// has none).
func withMetrics(t *testing.T) (func(*daemon.Config), func(name string) float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	value := func(name string) float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != name || len(f.Metric) != 1 {
				continue
			}
			if c := f.Metric[0].Counter; c != nil {
				return c.GetValue()
			}
			return f.Metric[0].GetGauge().GetValue()
		}
		return 0
	}
	return func(c *daemon.Config) { c.Telemetry.Metrics = m }, value
}
