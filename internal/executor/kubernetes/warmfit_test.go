package kubernetes

import (
	"testing"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/class"
)

// Which runs a warm pod may serve: only those whose pod would be the same
// in every field. A run of another trust takes one only when its trust
// gives it the same network and pull credentials.
func TestFitsWarm(t *testing.T) {
	t.Parallel()
	const runner = "did:plc:runner"
	registryOnly, err := ParsePullSecret("regcred=registry.example/*")
	if err != nil {
		t.Fatal(err)
	}
	forUntrusted, err := ParsePullSecret("regcred=busybox*,untrusted")
	if err != nil {
		t.Fatal(err)
	}
	trustedOnly, err := ParsePullSecret("regcred=busybox*")
	if err != nil {
		t.Fatal(err)
	}
	base := PodOptions{Image: "busybox:stable"}
	def, _ := class.Set{}.Pick("", true)
	run := func(mod func(*executor.Spec)) executor.Spec {
		s := executor.Spec{RunID: "r1", Runner: runner, Trusted: true,
			Annotations: map[string]string{"dev.knotless.check": "at://x/dev.knotless.check/1"}}
		if mod != nil {
			mod(&s)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		opts PodOptions
		spec executor.Spec
		fits bool
	}{
		{"a trusted run of the default image", base, run(nil), true},
		{"the default image named", base, run(func(s *executor.Spec) { s.Image = "busybox:stable" }), true},
		{"a timeout of its own (the deadline is set when taken)", base, run(func(s *executor.Spec) { s.Timeout = 5 * time.Minute }), true},
		{"another image", base, run(func(s *executor.Spec) { s.Image = "alpine:3.20" }), false},
		{"a CPU request", base, run(func(s *executor.Spec) { s.Resources.CPU = "1" }), false},
		{"a memory request", base, run(func(s *executor.Spec) { s.Resources.Memory = "1Gi" }), false},
		{"a cache directory", base, run(func(s *executor.Spec) { s.Caches = []string{"/cache"} }), false},
		{"kept for debugging", base, run(func(s *executor.Spec) { s.Keep = true }), false},
		{"untrusted: another egress", base, run(func(s *executor.Spec) { s.Trusted = false }), false},
		{"untrusted, the same egress", PodOptions{Image: base.Image, Egress: Egress{Mode: EgressDeny, Untrusted: EgressDeny}},
			run(func(s *executor.Spec) { s.Trusted = false }), true},
		{"untrusted, the same egress, a pull secret for trusted runs only",
			PodOptions{Image: base.Image, Egress: Egress{Mode: EgressDeny, Untrusted: EgressDeny}, ImagePullSecrets: []PullSecret{trustedOnly}},
			run(func(s *executor.Spec) { s.Trusted = false }), false},
		{"untrusted, the same egress, a pull secret for all runs",
			PodOptions{Image: base.Image, Egress: Egress{Mode: EgressDeny, Untrusted: EgressDeny}, ImagePullSecrets: []PullSecret{forUntrusted}},
			run(func(s *executor.Spec) { s.Trusted = false }), true},
		{"a pull secret for another registry", PodOptions{Image: base.Image, ImagePullSecrets: []PullSecret{registryOnly}}, run(nil), true},
		{"the operator's CPU request, as the warm pod has it", PodOptions{Image: base.Image, CPURequest: "500m"}, run(nil), true},
		{"the default class, as the warm pod has it", PodOptions{Image: base.Image, DefaultClass: def},
			run(func(s *executor.Spec) { s.Class = def }), true},
		{"another class", PodOptions{Image: base.Image, DefaultClass: def},
			run(func(s *executor.Spec) { s.Class = class.Class{Name: "large", CPU: "4", EphemeralStorage: "10Gi"} }), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ex := &Executor{cfg: Config{Runner: runner, Pod: tc.opts}}
			warm, err := BuildJob("ns", ex.warmSpec(), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			want, err := BuildJob("ns", tc.spec, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := fitsWarm(want, warm); got != tc.fits {
				t.Errorf("fitsWarm = %v, want %v", got, tc.fits)
			}
		})
	}
}
