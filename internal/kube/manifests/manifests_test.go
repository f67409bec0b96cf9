package manifests

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"knotless.dev/run/internal/kube/kubecred"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func testOptions() Options {
	return Options{
		Namespace: "knotless", RunsNamespace: "knotless-runs", Name: "knotless-runner",
		Image: "knotless-run:v1", StorageClass: "fast", StorageSize: "20Gi",
		DID: "did:plc:runner", PDS: "https://pds.example", AppPasswordSecret: "knotless-app-password",
		Repos:      []string{"did:plc:owner/app"},
		ServeFlags: []string{"--plc-url", "https://plc.example", "--concurrency=2"},
	}
}

// replicaOptions are testOptions with three replicas and the sealing
// key's Secret.
func replicaOptions() Options {
	o := testOptions()
	o.Replicas = 3
	o.SealingKeySecret = "knotless-sealing-key"
	return o
}

func TestManifestsGolden(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		path string
		o    Options
	}{
		{"testdata/manifests.golden.yaml", testOptions()},
		// serve --replicas: three pods, a PodDisruptionBudget, spread
		// across nodes, the sealing key from its Secret.
		{"testdata/manifests-replicas.golden.yaml", replicaOptions()},
	} {
		objs, err := Objects(tt.o)
		if err != nil {
			t.Fatal(err)
		}
		got, err := YAML(objs)
		if err != nil {
			t.Fatal(err)
		}
		if *update {
			if err := os.WriteFile(tt.path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Errorf("%s (-want +got; go test -update to rewrite):\n%s", tt.path, diff)
		}
	}
}

// TestManifestsReplicas: several replicas run serve --replicas, each
// named after its pod, with one sealing key; what serve refuses with
// replicas is refused here, naming the flag.
func TestManifestsReplicas(t *testing.T) {
	t.Parallel()
	objs, err := Objects(replicaOptions())
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, obj := range objs {
		kinds = append(kinds, obj.GetObjectKind().GroupVersionKind().Kind)
		if sts, ok := obj.(*appsv1.StatefulSet); ok {
			args := sts.Spec.Template.Spec.Containers[0].Args
			if got := *sts.Spec.Replicas; got != 3 || !slices.Contains(args, "--replicas") || slices.Contains(args, "--replica-name") {
				t.Errorf("StatefulSet replicas %d, serve args %q: want 3, --replicas and no --replica-name (the pod's name)", got, args)
			}
		}
	}
	if got, want := kinds[len(kinds)-2:], []string{"StatefulSet", "PodDisruptionBudget"}; !slices.Equal(got, want) {
		t.Errorf("last objects %q, want %q", got, want)
	}

	for _, tt := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no key", func(o *Options) { o.SealingKeySecret = "" }, "--replicas 3 needs --sealing-key-secret"},
		{"queue", func(o *Options) { o.ServeFlags = []string{"--queue"} }, "--serve-flag --queue with --replicas 3"},
		{"warm pods", func(o *Options) { o.ServeFlags = []string{"--warm-pods=2"} }, "--serve-flag --warm-pods with --replicas 3"},
		{"replica name", func(o *Options) { o.ServeFlags = []string{"--replica-name", "x"} }, "--serve-flag --replica-name: set by the manifests"},
		{"negative", func(o *Options) { o.Replicas = -1 }, "--replicas -1"},
	} {
		o := replicaOptions()
		tt.edit(&o)
		if _, err := Objects(o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.want)
		}
	}

	// One replica is one process, as before: no --replicas, no budget.
	objs, err = Objects(testOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		switch obj := obj.(type) {
		case *policyv1.PodDisruptionBudget:
			t.Error("one replica: a PodDisruptionBudget")
		case *appsv1.StatefulSet:
			if args := obj.Spec.Template.Spec.Containers[0].Args; slices.Contains(args, "--replicas") {
				t.Errorf("one replica: serve args %q", args)
			}
		}
	}
}

// TestRoleIsKubecredRules: the in-cluster runner has exactly the rights
// `knotless-run kubeconfig` grants, from the one list.
func TestRoleIsKubecredRules(t *testing.T) {
	t.Parallel()
	objs, err := Objects(testOptions())
	if err != nil {
		t.Fatal(err)
	}
	var roles int
	for _, o := range objs {
		if r, ok := o.(*rbacv1.Role); ok {
			roles++
			if diff := cmp.Diff(r.Rules, kubecred.Rules()); diff != "" {
				t.Errorf("Role rules (-got +kubecred):\n%s", diff)
			}
			if r.Namespace != "knotless-runs" {
				t.Errorf("Role in %q, want the runs namespace", r.Namespace)
			}
		}
	}
	if roles != 1 {
		t.Errorf("%d Roles, want 1", roles)
	}
}

func TestManifestsRequired(t *testing.T) {
	t.Parallel()
	o := testOptions()
	o.AppPasswordSecret = ""
	if _, err := Objects(o); err == nil || err.Error() != "the app password secret is required" {
		t.Errorf("Objects without a secret: %v", err)
	}
	for _, flags := range [][]string{{"--kubeconfig", "/x"}, {"--namespace=other"}, {"--ready-file", "/x"}, {"plc-url"}, {"--egress-untrusted=open"}} {
		o = testOptions()
		o.ServeFlags = flags
		if _, err := Objects(o); err == nil || !strings.Contains(err.Error(), "--serve-flag") {
			t.Errorf("Objects with serve flags %q: %v, want an error naming --serve-flag", flags, err)
		}
	}
	o = testOptions()
	o.EgressUntrusted = "everything"
	if _, err := Objects(o); err == nil || !strings.Contains(err.Error(), "--egress-untrusted") {
		t.Errorf("Objects with egress-untrusted everything: %v, want an error naming --egress-untrusted", err)
	}
	o = testOptions()
	o.StorageSize = "lots"
	if _, err := Objects(o); err == nil {
		t.Error("Objects with storage size lots: no error")
	}
}

// TestAdmissionPolicyIsKubecreds: the in-cluster runner's Jobs are held
// by the policy `knotless-run kubeconfig` installs, for its own
// ServiceAccount, applied before the StatefulSet; none with
// SkipAdmissionPolicy.
func TestAdmissionPolicyIsKubecreds(t *testing.T) {
	t.Parallel()
	o := testOptions()
	o.AllowImagePullSecrets = []string{"ci-pull"}
	objs, err := Objects(o)
	if err != nil {
		t.Fatal(err)
	}
	policy, binding, err := kubecred.AdmissionPolicy(kubecred.Policy{Namespace: "knotless", ServiceAccount: "knotless-runner", ImagePullSecrets: []string{"ci-pull"}})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, obj := range objs {
		kinds = append(kinds, obj.GetObjectKind().GroupVersionKind().Kind)
		switch obj := obj.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			if diff := cmp.Diff(policy, obj); diff != "" {
				t.Errorf("policy (-kubecred +manifests):\n%s", diff)
			}
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			if diff := cmp.Diff(binding, obj); diff != "" {
				t.Errorf("binding (-kubecred +manifests):\n%s", diff)
			}
		}
	}
	want := []string{"Namespace", "ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "StatefulSet"}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("objects in order (-want +got):\n%s", diff)
	}

	o.SkipAdmissionPolicy = true
	if objs, err = Objects(o); err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if k := obj.GetObjectKind().GroupVersionKind().Kind; strings.HasPrefix(k, "ValidatingAdmissionPolicy") {
			t.Errorf("SkipAdmissionPolicy: %s in the manifests", k)
		}
	}
}

// TestManifestsEgress: the runner's serve arguments give pulls' pods
// public egress unless the operator chooses another mode.
func TestManifestsEgress(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ mode, want string }{{"", "public"}, {"deny", "deny"}} {
		o := testOptions()
		o.EgressUntrusted = tt.mode
		objs, err := Objects(o)
		if err != nil {
			t.Fatal(err)
		}
		var args []string
		for _, obj := range objs {
			if sts, ok := obj.(*appsv1.StatefulSet); ok {
				args = sts.Spec.Template.Spec.Containers[0].Args
			}
		}
		i := slices.Index(args, "--egress-untrusted")
		if i < 0 || i+1 >= len(args) || args[i+1] != tt.want {
			t.Errorf("mode %q: serve args %q, want --egress-untrusted %s", tt.mode, args, tt.want)
		}
	}
}
