package docker

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/moby/moby/api/types/container"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/class"
)

// TestResourcesOfAClass: a run's requests (clamped to its class by the
// engine) are its container's limits; without them its class's bounds
// are, then the operator's defaults; the class's pids bound replaces
// the configured one (startContainer sets that when the class has none).
func TestResourcesOfAClass(t *testing.T) {
	t.Parallel()
	e := &Executor{cpu: 4e9, memory: 8 << 30}
	pids := int64(256)
	for _, tt := range []struct {
		name string
		r    executor.Resources
		c    class.Class
		want container.Resources
	}{
		{"the operator's defaults", executor.Resources{}, class.Class{Name: "default", EphemeralStorage: "10Gi"},
			container.Resources{NanoCPUs: 4e9, Memory: 8 << 30, MemorySwap: 8 << 30}},
		{"the class's bounds", executor.Resources{}, class.Class{Name: "small", CPU: "500m", Memory: "1Gi", Pids: 256},
			container.Resources{NanoCPUs: 5e8, Memory: 1 << 30, MemorySwap: 1 << 30, PidsLimit: &pids}},
		{"the run's requests within them", executor.Resources{CPU: "250m", Memory: "512Mi"}, class.Class{Name: "small", CPU: "500m", Memory: "1Gi"},
			container.Resources{NanoCPUs: 25e7, Memory: 512 << 20, MemorySwap: 512 << 20}},
	} {
		got, err := e.resources(tt.r, tt.c)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(got, tt.want); d != "" {
			t.Errorf("%s (-got +want):\n%s", tt.name, d)
		}
	}
}
