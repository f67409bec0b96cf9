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

func TestManifestsGolden(t *testing.T) {
	t.Parallel()
	objs, err := Objects(testOptions())
	if err != nil {
		t.Fatal(err)
	}
	got, err := YAML(objs)
	if err != nil {
		t.Fatal(err)
	}
	const path = "testdata/manifests.golden.yaml"
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("manifests (-want +got; go test -update to rewrite):\n%s", diff)
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
