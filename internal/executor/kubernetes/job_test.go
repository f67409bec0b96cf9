package kubernetes

import (
	"flag"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"knotless.dev/run/internal/executor"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func golden(t *testing.T, name string, v any) {
	t.Helper()
	got, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := "testdata/" + name
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", name, diff)
	}
}

func testSpec() executor.Spec {
	return executor.Spec{
		RunID:       "r123",
		Runner:      "did:plc:runner",
		Image:       "alpine:3.20",
		Resources:   executor.Resources{CPU: "2"},
		Timeout:     30 * time.Minute,
		Annotations: map[string]string{"dev.knotless.check": "at://did:plc:runner/dev.knotless.check/abc"},
	}
}

func TestBuildJobGolden(t *testing.T) {
	t.Parallel()
	job, err := BuildJob("runs", testSpec(), PodOptions{
		Image: "busybox:stable", MemoryRequest: "1Gi", CPULimit: "4", MemoryLimit: "2Gi",
		RuntimeClass: "gvisor", NodeSelector: map[string]string{"pool": "ci"},
		Tolerations: []corev1.Toleration{{Key: "ci", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
	})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "job.golden.yaml", job)
	golden(t, "networkpolicy.golden.yaml", BuildNetworkPolicy("runs", "did:plc:runner"))
}

func TestBuildJobRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		spec  func(*executor.Spec)
		opts  PodOptions
		check func(t *testing.T, got jobView)
	}{
		{"deadline is the timeout plus a margin", nil, PodOptions{}, func(t *testing.T, got jobView) {
			if got.deadline != int64((30*time.Minute+deadlineMargin)/time.Second) {
				t.Errorf("activeDeadlineSeconds = %d", got.deadline)
			}
		}},
		{"no timeout gets the default deadline", func(s *executor.Spec) { s.Timeout = 0 }, PodOptions{}, func(t *testing.T, got jobView) {
			if got.deadline != int64(defaultDeadline/time.Second) {
				t.Errorf("activeDeadlineSeconds = %d", got.deadline)
			}
		}},
		{"keep leaves no TTL", func(s *executor.Spec) { s.Keep = true }, PodOptions{}, func(t *testing.T, got jobView) {
			if got.ttl != nil {
				t.Errorf("ttlSecondsAfterFinished = %d, want none", *got.ttl)
			}
		}},
		{"workflow resources win over defaults", nil, PodOptions{CPURequest: "1", MemoryRequest: "512Mi"}, func(t *testing.T, got jobView) {
			if cpu, mem := got.requests.Cpu().String(), got.requests.Memory().String(); cpu != "2" || mem != "512Mi" {
				t.Errorf("requests cpu %s memory %s, want 2 and 512Mi", cpu, mem)
			}
		}},
		{"image from the workflow, else the default", func(s *executor.Spec) { s.Image = "" }, PodOptions{Image: "busybox:1"}, func(t *testing.T, got jobView) {
			if got.image != "busybox:1" {
				t.Errorf("image %s", got.image)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := testSpec()
			if tt.spec != nil {
				tt.spec(&spec)
			}
			job, err := BuildJob("runs", spec, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, view(job.Spec.Template.Spec, job.Spec.ActiveDeadlineSeconds, job.Spec.TTLSecondsAfterFinished))
		})
	}
}

type jobView struct {
	deadline int64
	ttl      *int32
	requests corev1.ResourceList
	image    string
}

func view(pod corev1.PodSpec, deadline *int64, ttl *int32) jobView {
	return jobView{deadline: *deadline, ttl: ttl, requests: pod.Containers[0].Resources.Requests, image: pod.Containers[0].Image}
}

// The security properties are asserted one by one, not only through the
// golden file, so a regenerated golden cannot quietly drop one.
func TestBuildJobIsLockedDown(t *testing.T) {
	t.Parallel()
	job, err := BuildJob("runs", testSpec(), PodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	c := pod.Containers[0]
	checks := map[string]bool{
		"backoffLimit 0":                  *job.Spec.BackoffLimit == 0,
		"restartPolicy Never":             pod.RestartPolicy == corev1.RestartPolicyNever,
		"no service account token":        pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken,
		"no service links":                pod.EnableServiceLinks != nil && !*pod.EnableServiceLinks,
		"no host namespaces":              !pod.HostNetwork && !pod.HostPID && !pod.HostIPC,
		"not privileged":                  c.SecurityContext.Privileged != nil && !*c.SecurityContext.Privileged,
		"no privilege escalation":         c.SecurityContext.AllowPrivilegeEscalation != nil && !*c.SecurityContext.AllowPrivilegeEscalation,
		"seccomp RuntimeDefault":          pod.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault,
		"all capabilities dropped":        len(c.SecurityContext.Capabilities.Drop) == 1 && c.SecurityContext.Capabilities.Drop[0] == "ALL",
		"one run per node":                pod.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey == corev1.LabelHostname,
		"labelled with runner and run":    job.Labels[LabelRunner] == RunnerLabel("did:plc:runner") && job.Labels[LabelRun] == "r123",
		"pod labelled like the job":       pod.Affinity != nil && job.Spec.Template.Labels[LabelRunner] == job.Labels[LabelRunner],
		"raw DID annotated":               job.Annotations[AnnotationDID] == "did:plc:runner",
		"spool volume is memory":          pod.Volumes[3].EmptyDir.Medium == corev1.StorageMediumMemory,
		"no env (secrets never in specs)": len(c.Env) == 0 && len(c.EnvFrom) == 0,
	}
	for _, v := range pod.Volumes {
		checks["no hostPath "+v.Name] = v.HostPath == nil
	}
	for name, ok := range checks {
		if !ok {
			t.Errorf("job is not locked down: %s", name)
		}
	}
	for _, cap := range c.SecurityContext.Capabilities.Add {
		switch cap {
		case "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID":
		default:
			t.Errorf("capability %s added", cap)
		}
	}
}

func TestRunnerLabelIsLabelSafe(t *testing.T) {
	t.Parallel()
	got := RunnerLabel("did:web:example.com:user/with:odd%chars")
	if len(got) != 20 || got != RunnerLabel("did:web:example.com:user/with:odd%chars") {
		t.Errorf("RunnerLabel = %q", got)
	}
}

func TestControlLines(t *testing.T) {
	t.Parallel()
	c := &control{started: make(chan struct{})}
	_, _ = c.Write([]byte("knotless: star"))
	_, _ = c.Write([]byte("ted\nknotless: exit 3 120\n"))
	code, n, ok := c.result()
	if !c.hasStarted() || !ok || code != 3 || n != 120 {
		t.Errorf("control parse: started %v, exit %d %d %v", c.hasStarted(), code, n, ok)
	}
}
