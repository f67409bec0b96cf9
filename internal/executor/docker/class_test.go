package docker

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

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

// TestClassLimits: on the private dockerd, a run in a class gets the
// class's CPU, memory and pids bounds as its container's, as its
// processes see them in their cgroup.
func TestClassLimits(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	ex := newExecutor(t, d, runner(t), Config{PidsLimit: 300})
	cls := class.Class{Name: "small", CPU: "250m", Memory: "128Mi", Pids: 64, EphemeralStorage: "10Gi"}
	sess, err := ex.Start(context.Background(), executor.Spec{RunID: "class1", Runner: ex.cfg.Runner, Image: d.Image(), Class: cls})
	if err != nil {
		t.Fatal(err)
	}
	s := sess.(*Session)
	t.Cleanup(func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	in, err := ex.cli.ContainerInspect(context.Background(), s.id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hc := in.Container.HostConfig
	if hc.PidsLimit == nil || *hc.PidsLimit != 64 || hc.Memory != 128<<20 || hc.NanoCPUs != 250_000_000 {
		t.Errorf("limits: pids %v memory %d nanocpus %d; want the class's 64, 128Mi, 250m", hc.PidsLimit, hc.Memory, hc.NanoCPUs)
	}
	out, code := runStep(t, s, "1", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max\n")
	if want := "134217728\n64\n"; code != 0 || out != want {
		t.Errorf("inside the container:\n%s(exit %d), want\n%s", out, code, want)
	}
}
