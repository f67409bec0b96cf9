package kubernetes

import (
	"testing"
	"time"

	"knotless.dev/run/internal/executor"
)

// A run's services are containers of its pod, beside the run container:
// each its image (with the pull credentials its trust allows), env,
// ports, command and readiness probe, locked down like the steps, with
// no volume of the run's; the pod records their start timeouts.
func TestBuildJobServicesGolden(t *testing.T) {
	t.Parallel()
	spec := testSpec()
	spec.Services = []executor.Service{
		{Name: "db", Image: "postgres:16", Env: []executor.EnvVar{{Name: "POSTGRES_PASSWORD", Value: "test"}}, Ports: []int{5432},
			Ready: executor.Probe{TCP: 5432, Timeout: 10 * time.Second}},
		{Name: "web", Image: "registry.example.com/web:1", Ports: []int{8080}, Command: []string{"web", "--port", "8080"},
			Ready: executor.Probe{HTTPPath: "/healthz", HTTPPort: 8080, Timeout: time.Minute}},
		{Name: "cmd", Image: "alpine:3.20", Ready: executor.Probe{Command: "test -e /tmp/up", Timeout: time.Minute}},
		{Name: "bare", Image: "alpine:3.20", Ready: executor.Probe{Timeout: time.Minute}},
	}
	job, err := BuildJob("runs", spec, PodOptions{
		CPULimit: "4", MemoryLimit: "2Gi",
		ImagePullSecrets: []PullSecret{
			{Name: "ci-pull", Image: "alpine:*"},
			{Name: "other-pull", Image: "registry.example.com/*", Untrusted: true},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "job-services.golden.yaml", job.Spec.Template)
}

// A step with an image of its own runs in a container of that image in
// the run's pod, one per image, named after its first step: the
// keep-alive, the run's directories mounted, locked down, its pull
// credentials as the run's trust allows, and no requests of its own; the
// Job records which container each such step runs in.
func TestBuildJobStepImagesGolden(t *testing.T) {
	t.Parallel()
	spec := testSpec()
	spec.StepImages = map[string]string{"2": "golang:1.26", "4": "node:22", "10": "golang:1.26"}
	job, err := BuildJob("runs", spec, PodOptions{CPULimit: "4"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := job.Annotations[AnnotationStepContainers], "10=step-2,2=step-2,4=step-4"; got != want {
		t.Errorf("annotation %s = %q, want %q", AnnotationStepContainers, got, want)
	}
	golden(t, "job-step-images.golden.yaml", job.Spec.Template.Spec.Containers[1:])
}
