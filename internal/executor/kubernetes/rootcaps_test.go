package kubernetes

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/kube/kubecred"
)

// TestRootCapabilitiesAreThePolicys: the capabilities a root run adds are
// the ones the runner's admission policy lets it add (kubecred keeps its
// own list: it cannot import this package).
func TestRootCapabilitiesAreThePolicys(t *testing.T) {
	t.Parallel()
	if diff := cmp.Diff(kubecred.RootCapabilities(), rootCapabilities()); diff != "" {
		t.Errorf("root capabilities (-policy +BuildJob):\n%s", diff)
	}
}
