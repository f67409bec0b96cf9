package kubernetes

import (
	"flag"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/class"
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
	spec := testSpec()
	spec.Trusted = true
	job, err := BuildJob("runs", spec, PodOptions{
		Image: "busybox:stable", MemoryRequest: "1Gi", CPULimit: "4", MemoryLimit: "2Gi",
		RuntimeClass: "gvisor", NodeSelector: map[string]string{"pool": "ci"},
		Tolerations: []corev1.Toleration{{Key: "ci", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		ImagePullSecrets: []PullSecret{
			{Name: "ci-pull", Image: "alpine:*"},
			{Name: "other-pull", Image: "registry.example.com/*", Untrusted: true},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "job.golden.yaml", job)
	golden(t, "networkpolicy.golden.yaml", BuildNetworkPolicy("runs", "did:plc:runner"))
	golden(t, "networkpolicy-deny.golden.yaml", BuildEgressPolicy("runs", "did:plc:runner", EgressDeny, nil))
	block := []netip.Prefix{LinkLocal, netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("2001:db8::1/128")}
	golden(t, "networkpolicy-allow-dns.golden.yaml", BuildEgressPolicy("runs", "did:plc:runner", EgressAllowDNS, block))
	golden(t, "networkpolicy-public.golden.yaml", BuildEgressPolicy("runs", "did:plc:runner", EgressPublic, block))
	root, err := BuildJob("runs", testSpec(), PodOptions{AllowRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "job-allow-root.golden.yaml", root.Spec.Template.Spec.Containers[0].SecurityContext)
}

// A run in a class: the class's bounds are the container's limits (an
// operator's default request above them lowered to them), its ephemeral
// storage the disk limit the kubelet evicts the pod past, its node
// selector over the operator's and its tolerations after them.
func TestBuildJobClassGolden(t *testing.T) {
	t.Parallel()
	spec := testSpec()
	spec.Resources = executor.Resources{CPU: "3"} // clamped by the engine already
	spec.Class = class.Class{
		Name: "large", CPU: "3", Memory: "6Gi", EphemeralStorage: "5Gi",
		NodeSelector: map[string]string{"pool": "big"},
		Tolerations:  []class.Toleration{{Key: "dedicated", Value: "ci", Effect: "NoSchedule"}},
	}
	job, err := BuildJob("runs", spec, PodOptions{
		Image: "busybox:stable", MemoryRequest: "8Gi", CPULimit: "4", MemoryLimit: "16Gi",
		NodeSelector: map[string]string{"pool": "ci", "zone": "a"},
		Tolerations:  []corev1.Toleration{{Key: "ci", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
	})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "job-class.golden.yaml", job)
	pod := job.Spec.Template.Spec
	res := pod.Containers[0].Resources
	for name, ok := range map[string]bool{
		"ephemeral-storage limit 5Gi":   res.Limits.StorageEphemeral().String() == "5Gi",
		"cpu limit the class's":         res.Limits.Cpu().String() == "3",
		"memory limit the class's":      res.Limits.Memory().String() == "6Gi",
		"memory request lowered to it":  res.Requests.Memory().String() == "6Gi",
		"class's node selector over":    pod.NodeSelector["pool"] == "big" && pod.NodeSelector["zone"] == "a",
		"class's toleration after ours": len(pod.Tolerations) == 2 && pod.Tolerations[1].Key == "dedicated" && pod.Tolerations[1].Value == "ci",
	} {
		if !ok {
			t.Errorf("class large: not %s: %+v", name, res)
		}
	}
	spec.Class.Pids = 100
	if _, err := BuildJob("runs", spec, PodOptions{}); err == nil || !strings.HasPrefix(err.Error(), "class large: pids: ") {
		t.Errorf("a class with pids: %v, want refused naming the class", err)
	}
}

// A pull secret goes only to the images its pattern matches, whole and
// anchored, and to an untrusted run only when marked untrusted. An
// untrusted run whose image a withheld secret matches pulls Always, so
// the node's copy from a trusted run's pull is not started without the
// registry's say.
func TestBuildJobPullSecrets(t *testing.T) {
	t.Parallel()
	secrets := []PullSecret{
		{Name: "team-pull", Image: "registry.example.com/team/*"},
		{Name: "mirror-pull", Image: "mirror.example.com/*", Untrusted: true},
		{Name: "team-pull", Image: "registry.example.com/team/tools/*"},
		{Name: "base-pull", Image: "registry.example.com/base:[0-9]*", Untrusted: true},
	}
	type pull struct {
		Secrets []string
		Policy  corev1.PullPolicy
	}
	for _, tt := range []struct {
		name    string
		image   string
		trusted bool
		want    pull
	}{
		{"trusted, matching", "registry.example.com/team/app:1", true, pull{[]string{"team-pull"}, corev1.PullIfNotPresent}},
		{"trusted, the second pattern of a name", "registry.example.com/team/tools/lint:2", true, pull{[]string{"team-pull"}, corev1.PullIfNotPresent}},
		{"trusted, * stops at /", "registry.example.com/team/app/sub:1", true, pull{nil, corev1.PullIfNotPresent}},
		{"trusted, anchored at the start", "evil.example/registry.example.com/team/app:1", true, pull{nil, corev1.PullIfNotPresent}},
		{"trusted, anchored at the end", "registry.example.com/base:1-evil/x", true, pull{nil, corev1.PullIfNotPresent}},
		{"trusted, a public image", "alpine:3.20", true, pull{nil, corev1.PullIfNotPresent}},
		{"untrusted, not marked: withheld, pulled Always", "registry.example.com/team/app:1", false, pull{nil, corev1.PullAlways}},
		{"untrusted, marked", "mirror.example.com/node:22", false, pull{[]string{"mirror-pull"}, corev1.PullIfNotPresent}},
		{"untrusted, marked pattern with a class", "registry.example.com/base:12", false, pull{[]string{"base-pull"}, corev1.PullIfNotPresent}},
		{"untrusted, a public image", "alpine:3.20", false, pull{nil, corev1.PullIfNotPresent}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := testSpec()
			spec.Image, spec.Trusted = tt.image, tt.trusted
			job, err := BuildJob("runs", spec, PodOptions{ImagePullSecrets: secrets})
			if err != nil {
				t.Fatal(err)
			}
			pod := job.Spec.Template.Spec
			got := pull{Policy: pod.Containers[0].ImagePullPolicy}
			for _, r := range pod.ImagePullSecrets {
				got.Secrets = append(got.Secrets, r.Name)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("image %s, trusted %v (-want +got):\n%s", tt.image, tt.trusted, diff)
			}
		})
	}
}

func TestParsePullSecret(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in      string
		want    PullSecret
		wantErr string
	}{
		{"ci-pull=registry.example.com/team/*", PullSecret{Name: "ci-pull", Image: "registry.example.com/team/*"}, ""},
		{"ci-pull=registry.example.com:5000/team/app:*,untrusted", PullSecret{Name: "ci-pull", Image: "registry.example.com:5000/team/app:*", Untrusted: true}, ""},
		{"ci-pull", PullSecret{}, "no image pattern: write NAME=PATTERN"},
		{"ci-pull=", PullSecret{}, "no image pattern"},
		{"ci-pull=,untrusted", PullSecret{}, `image pattern ""`},
		{"Bad_Name=registry.example.com/*", PullSecret{}, `"Bad_Name" is not a Secret name`},
		{"ci-pull=registry.example.com/*,trusted", PullSecret{}, `"trusted" after the pattern`},
		{"ci-pull=registry.example.com/[a-", PullSecret{}, "syntax error in pattern"},
	} {
		got, err := ParsePullSecret(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParsePullSecret(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParsePullSecret(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParsePullSecret(%q) (-want +got):\n%s", tt.in, diff)
		}
		if got.String() != tt.in {
			t.Errorf("%q reads back as %q", tt.in, got.String())
		}
	}
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
// golden file, so a regenerated golden cannot quietly drop one. By
// default the pod meets Pod Security "restricted": every container, init
// containers too, runs as a non-root numeric user with no capability.
func TestBuildJobIsLockedDown(t *testing.T) {
	t.Parallel()
	job, err := BuildJob("runs", testSpec(), PodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	psc := pod.SecurityContext
	checks := map[string]bool{
		// Only a pod that ran nothing is replaced: a non-zero exit or a
		// disruption fails the Job.
		"backoff only for refused pods": *job.Spec.BackoffLimit == admissionRetries && len(job.Spec.PodFailurePolicy.Rules) == 2,
		"disruption fails the job": job.Spec.PodFailurePolicy.Rules[0].Action == batchv1.PodFailurePolicyActionFailJob &&
			job.Spec.PodFailurePolicy.Rules[0].OnPodConditions[0].Type == corev1.DisruptionTarget,
		"any exit but 0 fails the job": job.Spec.PodFailurePolicy.Rules[1].Action == batchv1.PodFailurePolicyActionFailJob &&
			job.Spec.PodFailurePolicy.Rules[1].OnExitCodes.ContainerName == nil &&
			job.Spec.PodFailurePolicy.Rules[1].OnExitCodes.Operator == batchv1.PodFailurePolicyOnExitCodesOpNotIn &&
			len(job.Spec.PodFailurePolicy.Rules[1].OnExitCodes.Values) == 1 && job.Spec.PodFailurePolicy.Rules[1].OnExitCodes.Values[0] == 0,
		"restartPolicy Never":          pod.RestartPolicy == corev1.RestartPolicyNever,
		"no service account token":     pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken,
		"no service links":             pod.EnableServiceLinks != nil && !*pod.EnableServiceLinks,
		"no host namespaces":           !pod.HostNetwork && !pod.HostPID && !pod.HostIPC,
		"seccomp RuntimeDefault":       psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault,
		"pod runAsNonRoot":             psc.RunAsNonRoot != nil && *psc.RunAsNonRoot,
		"pod numeric non-root user":    psc.RunAsUser != nil && *psc.RunAsUser > 0,
		"pod non-root group":           psc.RunAsGroup != nil && *psc.RunAsGroup > 0,
		"volumes group-owned":          psc.FSGroup != nil && *psc.FSGroup == *psc.RunAsGroup,
		"one run per node":             pod.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey == corev1.LabelHostname,
		"labelled with runner and run": job.Labels[LabelRunner] == RunnerLabel("did:plc:runner") && job.Labels[LabelRun] == "r123",
		"pod labelled like the job":    pod.Affinity != nil && job.Spec.Template.Labels[LabelRunner] == job.Labels[LabelRunner],
		"raw DID annotated":            job.Annotations[AnnotationDID] == "did:plc:runner",
		"spool volume is memory":       pod.Volumes[3].EmptyDir.Medium == corev1.StorageMediumMemory,
	}
	for _, v := range pod.Volumes {
		checks["no hostPath "+v.Name] = v.HostPath == nil
	}
	for _, c := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
		sc := c.SecurityContext
		for name, ok := range map[string]bool{
			"has a security context":          sc != nil,
			"not privileged":                  sc != nil && sc.Privileged != nil && !*sc.Privileged,
			"no privilege escalation":         sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
			"runAsNonRoot":                    sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot,
			"non-root user":                   sc != nil && sc.RunAsUser != nil && *sc.RunAsUser > 0,
			"seccomp RuntimeDefault":          sc != nil && sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault,
			"all capabilities dropped":        sc != nil && sc.Capabilities != nil && slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}),
			"no capability added":             sc != nil && sc.Capabilities != nil && len(sc.Capabilities.Add) == 0,
			"no env (secrets never in specs)": len(c.Env) == 0 && len(c.EnvFrom) == 0,
		} {
			checks["container "+c.Name+": "+name] = ok
		}
	}
	for name, ok := range checks {
		if !ok {
			t.Errorf("job is not locked down: %s", name)
		}
	}
}

// The operator's opt-out for images that need root keeps everything but
// the user, and adds back only the six capabilities root build tools use.
func TestBuildJobAllowRoot(t *testing.T) {
	t.Parallel()
	job, err := BuildJob("runs", testSpec(), PodOptions{AllowRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	sc := pod.Containers[0].SecurityContext
	if pod.SecurityContext.RunAsNonRoot != nil || pod.SecurityContext.RunAsUser != nil || sc.RunAsUser != nil || sc.RunAsNonRoot != nil {
		t.Errorf("allow-root still sets a user: pod %+v, container %+v", pod.SecurityContext, sc)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged ||
		pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("allow-root loosened more than the user: %+v", sc)
	}
	for _, c := range sc.Capabilities.Add {
		switch c {
		case "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID":
		default:
			t.Errorf("capability %s added", c)
		}
	}
}

// Egress other than open blocks what a pod must never reach: with deny
// nothing goes out; with allow-dns only port 53, and never to the
// blocked prefixes; with public DNS and every port to the public
// internet, never to a link-local, private, shared or loopback address
// nor to a blocked one. Untrusted runs get public unless the operator
// says otherwise; trusted runs open.
func TestNetworkPolicyEgress(t *testing.T) {
	t.Parallel()
	block, err := DefaultEgressBlock(t.Context(), "https://203.0.113.5:6443", []netip.Prefix{netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("2001:db8::1/128")})
	if err != nil {
		t.Fatal(err)
	}
	ingress := BuildNetworkPolicy("runs", "did:plc:runner")
	if !slices.Equal(ingress.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(ingress.Spec.Ingress) != 0 {
		t.Errorf("ingress policy: types %v, rules %v; want Ingress and no rule", ingress.Spec.PolicyTypes, ingress.Spec.Ingress)
	}
	if open := BuildEgressPolicy("runs", "did:plc:runner", EgressOpen, block); open != nil {
		t.Errorf("open egress has a policy: %+v", open.Spec)
	}
	deny := BuildEgressPolicy("runs", "did:plc:runner", EgressDeny, block)
	if !slices.Equal(deny.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) || len(deny.Spec.Egress) != 0 {
		t.Errorf("deny: types %v, rules %v; want Egress and no rule", deny.Spec.PolicyTypes, deny.Spec.Egress)
	}
	dns := BuildEgressPolicy("runs", "did:plc:runner", EgressAllowDNS, block)
	if !slices.Contains(dns.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || len(dns.Spec.Egress) != 1 {
		t.Fatalf("allow-dns: types %v, rules %v", dns.Spec.PolicyTypes, dns.Spec.Egress)
	}
	checkDNSRule(t, "allow-dns", dns.Spec.Egress[0])

	public := BuildEgressPolicy("runs", "did:plc:runner", EgressPublic, block)
	if !slices.Contains(public.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || len(public.Spec.Egress) != 2 {
		t.Fatalf("public: types %v, rules %v", public.Spec.PolicyTypes, public.Spec.Egress)
	}
	checkDNSRule(t, "public", public.Spec.Egress[0])
	rule := public.Spec.Egress[1]
	if len(rule.Ports) != 0 || len(rule.To) != 2 || rule.To[0].IPBlock == nil || rule.To[1].IPBlock == nil {
		t.Fatalf("public's second rule: %+v; want every port to two ipBlocks", rule)
	}
	v4, v6 := rule.To[0].IPBlock, rule.To[1].IPBlock
	if v4.CIDR != "0.0.0.0/0" || v6.CIDR != "::/0" {
		t.Errorf("public's ipBlocks %s and %s, want 0.0.0.0/0 and ::/0", v4.CIDR, v6.CIDR)
	}
	allowed := func(addr string) bool {
		a := netip.MustParseAddr(addr)
		b := v4
		if a.Is6() {
			b = v6
		}
		for _, e := range b.Except {
			if netip.MustParsePrefix(e).Contains(a) {
				return false
			}
		}
		return netip.MustParsePrefix(b.CIDR).Contains(a)
	}
	for _, addr := range []string{
		"169.254.169.254", "169.254.0.1", // metadata, link-local
		"10.0.0.1", "10.96.0.1", "172.16.0.1", "172.31.255.254", "192.168.1.1", // private: nodes, Services
		"100.64.0.1", "100.127.255.254", "127.0.0.1", // shared, loopback
		"203.0.113.5", "192.0.2.7", // the API server, --egress-block
		"fd00::1", "fe80::1", "::1", "2001:db8::1", // unique-local, link-local, loopback, --egress-block
	} {
		if allowed(addr) {
			t.Errorf("public egress reaches %s", addr)
		}
	}
	for _, addr := range []string{"198.51.100.7", "8.8.8.8", "100.128.0.1", "172.32.0.1", "2001:db8::2", "2606:4700::1"} {
		if !allowed(addr) {
			t.Errorf("public egress does not reach the public address %s", addr)
		}
	}
	if !slices.Contains(v4.Except, "169.254.0.0/16") || slices.Contains(v4.Except, "169.254.169.254/32") {
		t.Errorf("public's IPv4 except list %v: want one 169.254.0.0/16, nothing inside it twice", v4.Except)
	}

	for _, tt := range []struct {
		egress  Egress
		trusted bool
		want    EgressMode
	}{
		{Egress{}, true, EgressOpen},
		{Egress{}, false, EgressPublic},
		{Egress{Mode: EgressDeny}, true, EgressDeny},
		{Egress{Mode: EgressDeny}, false, EgressPublic},
		{Egress{Mode: EgressOpen, Untrusted: EgressAllowDNS}, false, EgressAllowDNS},
		{Egress{Untrusted: EgressOpen}, false, EgressOpen},
	} {
		if got := tt.egress.For(tt.trusted); got != tt.want {
			t.Errorf("%+v.For(trusted %v) = %s, want %s", tt.egress, tt.trusted, got, tt.want)
		}
	}
}

// A run pod carries the label of its mode: exactly the policy of that
// mode selects it, and the ingress policy selects every pod.
func TestEgressPolicySelectsItsPods(t *testing.T) {
	t.Parallel()
	modes := []EgressMode{EgressOpen, EgressDeny, EgressAllowDNS, EgressPublic}
	for _, trusted := range modes {
		for _, untrusted := range modes {
			opts := PodOptions{Egress: Egress{Mode: trusted, Untrusted: untrusted}}
			for _, isTrusted := range []bool{true, false} {
				spec := testSpec()
				spec.Trusted = isTrusted
				job, err := BuildJob("runs", spec, opts)
				if err != nil {
					t.Fatal(err)
				}
				podLabels := labels.Set(job.Spec.Template.Labels)
				want := untrusted
				if isTrusted {
					want = trusted
				}
				if !selects(BuildNetworkPolicy("runs", spec.Runner), podLabels) {
					t.Errorf("the ingress policy does not select a %s pod", want)
				}
				for _, m := range modes {
					np := BuildEgressPolicy("runs", spec.Runner, m, nil)
					if np == nil {
						continue
					}
					if got := selects(np, podLabels); got != (m == want) {
						t.Errorf("trusted %v, egress %s/%s: the %s policy selects the pod: %v", isTrusted, trusted, untrusted, m, got)
					}
				}
			}
		}
	}
}

func selects(np *networkingv1.NetworkPolicy, pod labels.Set) bool {
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	return err == nil && sel.Matches(pod)
}

// checkDNSRule: port 53 over UDP and TCP only, never to a blocked prefix.
func checkDNSRule(t *testing.T, mode string, rule networkingv1.NetworkPolicyEgressRule) {
	t.Helper()
	for _, p := range rule.Ports {
		if p.Port == nil || p.Port.IntValue() != 53 || p.EndPort != nil {
			t.Errorf("%s allows port %v (end %v)", mode, p.Port, p.EndPort)
		}
	}
	if len(rule.Ports) != 2 {
		t.Errorf("%s ports %v, want UDP and TCP 53", mode, rule.Ports)
	}
	for _, peer := range rule.To {
		if peer.IPBlock == nil {
			continue
		}
		for _, want := range []string{"169.254.0.0/16", "203.0.113.5/32", "192.0.2.7/32"} {
			if !slices.Contains(peer.IPBlock.Except, want) {
				t.Errorf("%s ipBlock %s does not except %s: %v", mode, peer.IPBlock.CIDR, want, peer.IPBlock.Except)
			}
		}
	}
}

func TestPolicyMatches(t *testing.T) {
	t.Parallel()
	want := BuildEgressPolicy("runs", "did:plc:runner", EgressDeny, nil)
	allowAll := want.DeepCopy()
	allowAll.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	otherPods := want.DeepCopy()
	otherPods.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"x": "y"}}
	noEgress := want.DeepCopy()
	noEgress.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	allowAllEgress := want.DeepCopy()
	allowAllEgress.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
	otherMode := want.DeepCopy()
	otherMode.Spec.PodSelector.MatchLabels[LabelEgress] = string(EgressOpen)
	emptyLists := want.DeepCopy()
	emptyLists.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{}
	for _, tt := range []struct {
		name string
		have *networkingv1.NetworkPolicy
		want bool
	}{
		{"same", want.DeepCopy(), true},
		{"empty lists", emptyLists, true},
		{"allow-all ingress", allowAll, false},
		{"other pods", otherPods, false},
		{"egress not denied", noEgress, false},
		{"egress allowed to all", allowAllEgress, false},
		{"pods of another mode", otherMode, false},
	} {
		if got := policyMatches(tt.have, want); got != tt.want {
			t.Errorf("%s: policyMatches = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestControlLines(t *testing.T) {
	t.Parallel()
	c := &control{started: make(chan struct{})}
	_, _ = c.Write([]byte("knotless: star"))
	_, _ = c.Write([]byte("ted\nknotless: exit 3 120\n"))
	code, n, ok := c.result()
	if !c.hasStarted() || !ok || code != 3 || n != 120 || c.emptyOutputs() {
		t.Errorf("control parse: started %v, exit %d %d %v, outputs empty %v", c.hasStarted(), code, n, ok, c.emptyOutputs())
	}
	for line, want := range map[string]bool{
		"knotless: exit 0 5 outputs-empty\n":   true,
		"knotless: exit 0 5 outputs-full\n":    false,
		"knotless: exit 0 5 outputs-empty x\n": false,
	} {
		c := &control{started: make(chan struct{})}
		_, _ = c.Write([]byte(line))
		_, n, ok := c.result()
		if want && (!ok || n != 5 || !c.emptyOutputs()) || !want && c.emptyOutputs() {
			t.Errorf("control parse of %q: exit %v, length %d, outputs empty %v", line, ok, n, c.emptyOutputs())
		}
	}
}
