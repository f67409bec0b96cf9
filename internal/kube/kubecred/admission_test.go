package kubecred

import (
	"errors"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func golden(t *testing.T, name string, v ...any) {
	t.Helper()
	var got []byte
	for _, o := range v {
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		got = append(append(got, "---\n"...), b...)
	}
	path := "testdata/" + name
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got; go test -update to rewrite):\n%s", name, diff)
	}
}

func TestAdmissionPolicyGolden(t *testing.T) {
	t.Parallel()
	policy, binding, err := AdmissionPolicy(Policy{Namespace: "knotless-runs", ServiceAccount: "knotless-runner", ImagePullSecrets: []string{"ci-pull", "mirror-pull"}})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "admission-policy.golden.yaml", policy, binding)
	root, _, err := AdmissionPolicy(Policy{Namespace: "knotless-runs", ServiceAccount: "knotless-runner", AllowRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "admission-policy-allow-root.golden.yaml", root.Spec.Variables)
}

// The policy's properties one by one, so that a regenerated golden file
// cannot quietly weaken it: it matches only the runner's service account,
// on Jobs and Pods, refuses (Deny, failing closed), and each refusal is
// Forbidden with a message expression that names what was refused.
func TestAdmissionPolicyHoldsTheRunnerOnly(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{
		{Namespace: "knotless-runs", ServiceAccount: "knotless-runner"},
		{Namespace: "ci", ServiceAccount: "runner.a", AllowRoot: true, ImagePullSecrets: []string{"x"}},
	} {
		policy, binding, err := AdmissionPolicy(p)
		if err != nil {
			t.Fatal(err)
		}
		name := "knotless-run." + p.Namespace + "." + p.ServiceAccount
		spec := policy.Spec
		var rules []string
		for _, r := range spec.MatchConstraints.ResourceRules {
			rules = append(rules, strings.Join(r.APIGroups, ",")+"/"+strings.Join(r.Resources, ",")+":"+strings.Join(r.APIVersions, ",")+fmtOps(r.Operations))
		}
		vars := map[string]string{}
		for _, v := range spec.Variables {
			vars[v.Name] = v.Expression
		}
		checks := map[string]bool{
			"policy named after the service account":  policy.Name == name,
			"binding named after the service account": binding.Name == name,
			"binding refers to the policy":            binding.Spec.PolicyName == name,
			"binding denies":                          slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}),
			"binding has no params":                   binding.Spec.ParamRef == nil,
			"binding in every namespace":              binding.Spec.MatchResources == nil,
			"fails closed":                            spec.FailurePolicy != nil && *spec.FailurePolicy == admissionregistrationv1.Fail,
			"only the runner's username": len(spec.MatchConditions) == 1 &&
				spec.MatchConditions[0].Expression == `request.userInfo.username == "system:serviceaccount:`+p.Namespace+`:`+p.ServiceAccount+`"`,
			"jobs and pods, create and update": slices.Equal(rules, []string{"batch/jobs:v1 CREATE UPDATE", "/pods:v1 CREATE UPDATE"}),
			"labelled with the namespace":      policy.Labels[LabelServiceAccountNamespace] == p.Namespace && binding.Labels[LabelServiceAccountNamespace] == p.Namespace,
			"root as asked":                    vars["allowRoot"] == map[bool]string{true: "true", false: "false"}[p.AllowRoot],
			"pull secrets as asked":            vars["pullSecrets"] == celStrings(p.ImagePullSecrets),
			"root capabilities":                vars["rootCapabilities"] == `["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID"]`,
			"no params":                        spec.ParamKind == nil,
		}
		for i, v := range spec.Validations {
			checks["validation "+v.Message+": Forbidden"] = v.Reason != nil && *v.Reason == metav1.StatusReasonForbidden
			checks["validation "+v.Message+": message expression"] = v.MessageExpression != "" && v.Message != ""
			checks["validation "+v.Message+": its own"] = !slices.ContainsFunc(spec.Validations[:i], func(w admissionregistrationv1.Validation) bool { return w.Expression == v.Expression })
		}
		for name, ok := range checks {
			if !ok {
				t.Errorf("policy for %s/%s: not %s", p.Namespace, p.ServiceAccount, name)
			}
		}
	}
}

func fmtOps(ops []admissionregistrationv1.OperationType) string {
	var s string
	for _, o := range ops {
		s += " " + string(o)
	}
	return s
}

// TestAdmissionPolicyRefuses lists what the policy is for: each refusal
// the issue names has its own validation, before the catch-alls, and
// names what it refused.
func TestAdmissionPolicyRefuses(t *testing.T) {
	t.Parallel()
	policy, _, err := AdmissionPolicy(Policy{Namespace: "n", ServiceAccount: "s"})
	if err != nil {
		t.Fatal(err)
	}
	index := func(substr string) int {
		return slices.IndexFunc(policy.Spec.Validations, func(v admissionregistrationv1.Validation) bool { return strings.Contains(v.Expression, substr) })
	}
	// The catch-alls refuse the same shapes with a vaguer message: the
	// specific validation must be evaluated first.
	volumes, env := index("has(v.emptyDir)"), index("!has(e.valueFrom)) &&")
	if volumes < 0 || env < 0 {
		t.Fatalf("no catch-all for volumes (%d) or env (%d)", volumes, env)
	}
	for _, tt := range []struct {
		what, expr, names string
		before            int
	}{
		{"secret volumes", "!has(v.secret)", "v.secret.?secretName", volumes},
		{"projected secrets", "!has(s.secret)", "s.secret.?name", volumes},
		{"projected tokens", "!has(s.serviceAccountToken)", "v.name", volumes},
		{"host paths", "!has(v.hostPath)", "v.hostPath.?path", volumes},
		{"env from secrets", "!has(e.valueFrom.secretKeyRef)", "e.valueFrom.secretKeyRef.?name", env},
		{"envFrom secrets", "!has(e.secretRef)", "e.secretRef.?name", env},
		{"host namespaces", "hostNetwork", "'hostNetwork', 'hostPID', 'hostIPC'", -1},
		{"host ports", "hostPort", "p.hostPort", -1},
		{"token automount", "automountServiceAccountToken.orValue(true) == false", "automountServiceAccountToken", -1},
		{"privileged", "privileged", "c.name", -1},
		{"privilege escalation", "allowPrivilegeEscalation", "c.name", -1},
		{"capabilities not dropped", "'ALL' in", "c.name", -1},
		{"capabilities added", "capabilities.?add", "capabilities.add.filter", -1},
		{"root", "runAsNonRoot", "c.name", -1},
		{"seccomp", "seccompProfile", "c.name", -1},
		{"pull secrets", "imagePullSecrets", "s.?name", -1},
	} {
		i := index(tt.expr)
		if i < 0 {
			t.Errorf("%s: no validation with %q", tt.what, tt.expr)
			continue
		}
		if v := policy.Spec.Validations[i]; !strings.Contains(v.MessageExpression, tt.names) {
			t.Errorf("%s: message expression %q does not name what it refused (%s)", tt.what, v.MessageExpression, tt.names)
		}
		if tt.before >= 0 && i > tt.before {
			t.Errorf("%s: validation %d comes after the catch-all %d, whose message would be reported", tt.what, i, tt.before)
		}
	}
}

func TestAdmissionPolicyRefusesBadNames(t *testing.T) {
	t.Parallel()
	if _, _, err := AdmissionPolicy(Policy{Namespace: "n", ServiceAccount: strings.Repeat("a", 250)}); err == nil || !strings.Contains(err.Error(), "admission policy name") {
		t.Errorf("a name over 253 characters: %v", err)
	}
	if _, _, err := AdmissionPolicy(Policy{Namespace: "n", ServiceAccount: "s", ImagePullSecrets: []string{`a"b`}}); err == nil || !strings.Contains(err.Error(), `image pull secret "a\"b"`) {
		t.Errorf("a pull secret that is no Secret name: %v", err)
	}
}

func TestAdmissionPolicyServed(t *testing.T) {
	t.Parallel()
	resources := func(names ...string) *metav1.APIResourceList {
		l := &metav1.APIResourceList{GroupVersion: AdmissionGroupVersion}
		for _, n := range names {
			l.APIResources = append(l.APIResources, metav1.APIResource{Name: n})
		}
		return l
	}
	gone := apierrors.NewNotFound(schema.GroupResource{Group: "admissionregistration.k8s.io"}, "v1")
	for _, tt := range []struct {
		name string
		list *metav1.APIResourceList
		err  error
		want string // "" for served
		none bool   // wraps ErrNoAdmissionPolicy
	}{
		{"1.30 and later", resources("mutatingwebhookconfigurations", "validatingadmissionpolicies", "validatingadmissionpolicies/status", "validatingadmissionpolicybindings", "validatingwebhookconfigurations"), nil, "", false},
		{"1.29: webhooks only in v1", resources("mutatingwebhookconfigurations", "validatingwebhookconfigurations"), nil,
			"the API server does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30 or later): admissionregistration.k8s.io/v1 has no validatingadmissionpolicies or validatingadmissionpolicybindings", true},
		{"bindings missing", resources("validatingadmissionpolicies"), nil, "has no validatingadmissionpolicybindings", true},
		{"group version not served", nil, gone, "admissionregistration.k8s.io/v1 is not served", true},
		{"unreachable", nil, errors.New("connection refused"), "discover admissionregistration.k8s.io/v1: connection refused", false},
	} {
		err := admissionPolicyServed(tt.list, tt.err)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want served", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		case errors.Is(err, ErrNoAdmissionPolicy) != tt.none:
			t.Errorf("%s: %v wraps ErrNoAdmissionPolicy: %v, want %v", tt.name, err, errors.Is(err, ErrNoAdmissionPolicy), tt.none)
		}
	}
}

// The probe that kubeconfig offers is refused for its Secret volume
// alone: without it, it is the runner's own shape.
func TestAdmissionProbeMountsASecret(t *testing.T) {
	t.Parallel()
	job := AdmissionProbe("runs")
	spec := job.Spec.Template.Spec
	if len(spec.Volumes) != 1 || spec.Volumes[0].Secret == nil || spec.Volumes[0].Secret.SecretName != probeName {
		t.Errorf("probe volumes %+v, want one Secret volume", spec.Volumes)
	}
	if *spec.AutomountServiceAccountToken || !*spec.SecurityContext.RunAsNonRoot || *spec.Containers[0].SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("the probe is not otherwise the runner's shape: %+v", spec)
	}
}
