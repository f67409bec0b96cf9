package manifests

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"knotless.dev/run/internal/kube/kubecred"

	"knotless.dev/run/tests/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

// TestManifestsAccepted: the API server accepts every object `manifests`
// prints (server-side dry run, admission included), and the runner's pod
// template is admitted into a namespace enforcing Pod Security restricted.
func TestManifestsAccepted(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := testOptions()
	o.Namespace, o.RunsNamespace, o.StorageClass = c.Namespace, c.Namespace+"-runs", ""
	objs, err := Objects(o)
	if err != nil {
		t.Fatal(err)
	}
	cs := c.Clientset
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var sts *appsv1.StatefulSet
	for _, obj := range objs {
		switch obj := obj.(type) {
		case *corev1.Namespace:
			// Created for real: the Role and RoleBinding need it to exist.
			obj.Labels[clustertest.LabelTest] = "true"
			if _, err := cs.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
				t.Fatalf("Namespace %s: %v", obj.Name, err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = cs.CoreV1().Namespaces().Delete(ctx, obj.Name, metav1.DeleteOptions{})
			})
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(obj.Namespace).Create(ctx, obj, dry)
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(obj.Namespace).Create(ctx, obj, dry)
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(obj.Namespace).Create(ctx, obj, dry)
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, obj, dry)
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, obj, dry)
		case *appsv1.StatefulSet:
			sts = obj
			_, err = cs.AppsV1().StatefulSets(obj.Namespace).Create(ctx, obj, dry)
		default:
			t.Fatalf("unexpected object %T", obj)
		}
		if err != nil {
			t.Errorf("%T: %v", obj, err)
		}
	}
	if sts == nil {
		t.Fatal("no StatefulSet")
	}

	// Pod Security admission checks pods, not StatefulSets: try the
	// template as a pod where restricted is enforced. The pod's service
	// account must exist there, so it runs as the namespace's default one.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: o.RunsNamespace, Labels: sts.Spec.Template.Labels},
		Spec:       *sts.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.ServiceAccountName = "default"
	for i, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			pod.Spec.Volumes[i].VolumeSource = corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
		}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: dataVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Pods(o.RunsNamespace).Create(ctx, pod, dry)
		if err != nil && strings.Contains(err.Error(), "serviceaccount") {
			return false, nil // the default ServiceAccount is not made yet
		}
		return true, err
	})
	if err != nil {
		t.Errorf("runner pod in a restricted namespace: %v", err)
	}
}

// TestManifestsApplyAgain: the printed policy and binding apply as
// `kubectl apply --server-side` applies them, and applying the printed
// manifests again with another pull Secret updates the policy in place.
func TestManifestsApplyAgain(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := testOptions()
	o.Namespace, o.RunsNamespace, o.StorageClass = c.Namespace, c.Namespace+"-runs", ""
	name := kubecred.PolicyName(c.Namespace, o.Name)
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(pullSecrets ...string) {
		t.Helper()
		o.AllowImagePullSecrets = pullSecrets
		objs, err := Objects(o)
		if err != nil {
			t.Fatal(err)
		}
		stream, err := YAML(objs)
		if err != nil {
			t.Fatal(err)
		}
		force := true
		for _, doc := range strings.Split(string(stream), "---\n") {
			var obj unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(obj.GetKind(), "ValidatingAdmissionPolicy") {
				continue // the rest is TestManifestsAccepted's
			}
			resource := admissionregistrationv1.SchemeGroupVersion.WithResource(map[string]string{
				"ValidatingAdmissionPolicy":        "validatingadmissionpolicies",
				"ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
			}[obj.GetKind()])
			body, err := json.Marshal(obj.Object)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := dyn.Resource(resource).Patch(ctx, obj.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "kubectl", Force: &force}); err != nil {
				t.Fatalf("apply %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	pullSecrets := func() string {
		t.Helper()
		p, err := c.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range p.Spec.Variables {
			if v.Name == "pullSecrets" {
				return v.Expression
			}
		}
		return ""
	}
	apply("ci-pull")
	if got := pullSecrets(); got != `["ci-pull"]` {
		t.Errorf("pull secrets after the first apply: %s", got)
	}
	apply("ci-pull", "mirror-pull")
	if got := pullSecrets(); got != `["ci-pull", "mirror-pull"]` {
		t.Errorf("pull secrets after the second apply: %s, want the new list", got)
	}
	b, err := c.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
	if err != nil || b.Spec.PolicyName != name {
		t.Errorf("binding %s: %v, %+v", name, err, b)
	}
}
