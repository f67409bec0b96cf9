package manifests

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

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
