package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Scale signal. A namespace has no node for its new pods after
// RemoveCapacity and has one again after AddCapacity. It is done per
// namespace, so tests that run in parallel on the one cluster do not see
// each other's signal: the PodNodeSelector admission plugin gives every
// pod created in the namespace a node selector (capacityLabel) that the
// node carries only while the namespace has capacity. A pod created while
// the namespace has none stays Pending with PodScheduled=False,
// reason Unschedulable, until capacity comes back.

const nodeSelectorAnnotation = "scheduler.alpha.kubernetes.io/node-selector"

// capacityLabel is the node label that gives the namespace capacity.
func (c *Cluster) capacityLabel() string {
	return "capacity.knotless.dev/" + c.Namespace
}

// RemoveCapacity makes the cluster have no schedulable node for pods
// created from now on in the test's namespace.
func (c *Cluster) RemoveCapacity(ctx context.Context) error {
	if err := c.labelNodes(ctx, c.capacityLabel(), nil); err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{nodeSelectorAnnotation: c.capacityLabel() + "=true"},
	}})
	if err != nil {
		return fmt.Errorf("encode namespace patch: %w", err)
	}
	if _, err := c.Clientset.CoreV1().Namespaces().Patch(ctx, c.Namespace, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("set node selector of namespace %s: %w", c.Namespace, err)
	}
	return nil
}

// AddCapacity gives the test's namespace a schedulable node again: pods
// left Pending by RemoveCapacity are scheduled.
func (c *Cluster) AddCapacity(ctx context.Context) error {
	v := "true"
	c.capacityLabelled = true
	return c.labelNodes(ctx, c.capacityLabel(), &v)
}

// labelNodes sets (value != nil) or removes a label on every node.
func (c *Cluster) labelNodes(ctx context.Context, key string, value *string) error {
	nodes, err := c.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{key: value}}})
	if err != nil {
		return fmt.Errorf("encode node patch: %w", err)
	}
	for _, n := range nodes.Items {
		if _, err := c.Clientset.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label node %s: %w", n.Name, err)
		}
	}
	return nil
}

// Faults for the failure-matrix tests.

// RestartAPIServer kills the API server (SIGKILL: every watch and exec
// stream drops at once) and starts it again, returning once it is ready.
// It needs the cluster's scripts and run directory on this machine.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	if c.Info.Dir == "" {
		return fmt.Errorf("restart the API server: %w", errNoNodeInfo)
	}
	return Script(ctx, c.Info.Scripts, "restart-apiserver", []string{"KNOTLESS_CLUSTER_DIR=" + c.Info.Dir})
}

// StopAPIServerFor kills the API server (SIGKILL) and starts it again
// only after down (whole seconds), returning once the cluster is whole
// again, as RestartAPIServer does.
func (c *Cluster) StopAPIServerFor(ctx context.Context, down time.Duration) error {
	if c.Info.Dir == "" {
		return fmt.Errorf("stop the API server: %w", errNoNodeInfo)
	}
	secs := int(down.Round(time.Second) / time.Second)
	return Script(ctx, c.Info.Scripts, "restart-apiserver", []string{"KNOTLESS_CLUSTER_DIR=" + c.Info.Dir, "KNOTLESS_APISERVER_DOWN=" + strconv.Itoa(secs)})
}

// TokenConfig returns a client config that authenticates as the service
// account with a bound token from the TokenRequest API.
func (c *Cluster) TokenConfig(ctx context.Context, namespace, serviceAccount string) (*rest.Config, error) {
	expiry := int64(600) // the API's minimum
	tr, err := c.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}},
		metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("request a token for %s/%s: %w", namespace, serviceAccount, err)
	}
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

// RevokeToken revokes every token of a service account by deleting it:
// a bound token names the service account's UID, and the API server
// refuses it once that object is gone.
func (c *Cluster) RevokeToken(ctx context.Context, namespace, serviceAccount string) error {
	err := c.Clientset.CoreV1().ServiceAccounts(namespace).Delete(ctx, serviceAccount, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete service account %s/%s: %w", namespace, serviceAccount, err)
	}
	return nil
}

// DeleteJob deletes a Job as a user (or the runner's reaper) would, its
// pods going in the background.
func (c *Cluster) DeleteJob(ctx context.Context, namespace, name string) error {
	bg := metav1.DeletePropagationBackground
	err := c.Clientset.BatchV1().Jobs(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &bg})
	if err != nil {
		return fmt.Errorf("delete job %s/%s: %w", namespace, name, err)
	}
	return nil
}

// UnavailableImage is an image reference that no node has and no
// registry serves: a pod using it (pull policy Never or IfNotPresent)
// never starts.
const UnavailableImage = "knotless.test/unavailable:never-imported"

// TempImage tags the run image under a name of the test's own on the
// node, and returns the name; RemoveImage makes it unavailable later.
func (c *Cluster) TempImage(ctx context.Context) (string, error) {
	name := "knotless.test/temp-" + c.Namespace + ":1"
	if err := c.ctr(ctx, "images", "tag", "--force", c.Image, name); err != nil {
		return "", err
	}
	return name, nil
}

// RemoveImage removes an image from the node's containerd, so that new
// pods using it fail with ErrImageNeverPull or ImagePullBackOff. Do not
// remove the shared run image: use TempImage.
func (c *Cluster) RemoveImage(ctx context.Context, image string) error {
	return c.ctr(ctx, "images", "rm", "--sync", image)
}

func (c *Cluster) ctr(ctx context.Context, args ...string) error {
	if c.Info.ContainerdSock == "" {
		return fmt.Errorf("run ctr: %w", errNoNodeInfo)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	full := append([]string{"--address", c.Info.ContainerdSock, "-n", "k8s.io"}, args...)
	out, err := exec.CommandContext(ctx, "ctr", full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// PodWaitingReason returns the waiting reason of the pod's first
// container that has one (ErrImageNeverPull, ContainerCreating, ...).
func PodWaitingReason(p *corev1.Pod) string {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Waiting != nil && s.State.Waiting.Reason != "" {
			return s.State.Waiting.Reason
		}
	}
	return ""
}

// waitGranted waits until the API server's authorizer grants service
// account name every rule just bound to it: it learns of a Role and its
// RoleBinding through informers, a moment after their creation, and a
// request in between is refused.
func (c *Cluster) waitGranted(t testing.TB, ns, name string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user := "system:serviceaccount:" + ns + ":" + name
	for _, r := range rules {
		if len(r.Verbs) == 0 || len(r.Resources) == 0 {
			continue
		}
		resource, sub, _ := strings.Cut(r.Resources[0], "/")
		attrs := &authorizationv1.ResourceAttributes{Namespace: ns, Verb: r.Verbs[0], Resource: resource, Subresource: sub}
		if len(r.APIGroups) > 0 {
			attrs.Group = r.APIGroups[0]
		}
		for {
			review, err := c.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}, ResourceAttributes: attrs},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("ask whether %s may %s %s: %v", user, attrs.Verb, attrs.Resource, err)
			}
			if review.Status.Allowed {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s is still not granted %s %s a minute after its Role was bound: %s", user, attrs.Verb, attrs.Resource, review.Status.Reason)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// ScopedKubeconfig makes a ServiceAccount name in the test's namespace,
// binds it to a Role with rules, and writes a kubeconfig with a token for
// it into a temporary directory of the test.
func (c *Cluster) ScopedKubeconfig(t testing.TB, name string, rules []rbacv1.PolicyRule) string {
	t.Helper()
	ctx := context.Background()
	ns := c.Namespace
	if _, err := c.Clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clientset.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clientset.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitGranted(t, ns, name, rules)
	cfg, err := c.TokenConfig(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name, Namespace: ns}
	kc.CurrentContext = name
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// WarnOnJobCreate makes the API server answer every Job created in
// namespace ns with a warning that says message: a binding of a
// ValidatingAdmissionPolicy whose one validation always fails, with the
// action Warn. client-go hands such a warning to its logger, so a test
// can count on one client-go line from a runner that creates a Job. It
// returns once a dry-run create in ns gets the warning (the API server
// learns of a policy a moment after its creation); the test's clean-up
// deletes the policy and its binding.
func (c *Cluster) WarnOnJobCreate(t testing.TB, ns, message string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "knotless-test-warn-" + ns
	if len(name) > 63 {
		name = name[:63]
	}
	api := c.Clientset.AdmissionregistrationV1()
	fail := admissionregistrationv1.Fail
	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"batch"}, APIVersions: []string{"v1"}, Resources: []string{"jobs"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: message}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create admission policy %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := api.ValidatingAdmissionPolicies().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete admission policy %s: %v", name, err)
		}
	})
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns},
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create admission policy binding %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := api.ValidatingAdmissionPolicyBindings().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete admission policy binding %s: %v", name, err)
		}
	})

	var warnings warningRecorder
	cfg := rest.CopyConfig(c.Config)
	cfg.WarningHandlerWithContext = &warnings
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	probe := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "knotless-test-warn-probe"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "probe", Image: "probe"}},
		}}},
	}
	for !warnings.saw(message) {
		if _, err := cs.BatchV1().Jobs(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatalf("dry-run create of a Job in %s: %v", ns, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the API server does not warn of a Job created in %s a minute after admission policy %s", ns, name)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// warningRecorder keeps the warnings an API server sent a client.
type warningRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (w *warningRecorder) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, message string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, message)
}

func (w *warningRecorder) saw(s string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.ContainsFunc(w.seen, func(m string) bool { return strings.Contains(m, s) })
}
