package archtest

import (
	"sort"
	"strings"
	"testing"
)

// TestPartsObserveThroughTheirPorts: the daemon's parts tell what they
// do to the Observer ports they declare; internal/observe/telemetry (what the
// daemon plugs into them) and internal/observe/metrics are above them. A part
// importing either would reach the metrics around its port. (indigo's
// identity package registers metrics of its own with client_golang, so
// the client itself is not the mark.)
func TestPartsObserveThroughTheirPorts(t *testing.T) {
	t.Parallel()
	var pkgs []string
	for p := range parts {
		pkgs = append(pkgs, module+p)
	}
	sort.Strings(pkgs)
	graph := importGraph(t, pkgs...)
	bad := func(dep string) bool {
		return dep == module+"internal/observe/telemetry" || dep == module+"internal/observe/metrics"
	}
	for _, p := range pkgs {
		if chain := importChain(graph, p, bad); chain != nil {
			t.Errorf("%s imports %s: a part tells its Observer port, which the daemon joins to the metrics: %s", p, chain[len(chain)-1], strings.Join(chain, " -> "))
		}
	}
}
