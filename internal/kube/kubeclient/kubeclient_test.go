package kubeclient_test

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"knotless.dev/run/internal/kube/kubeclient"
	"knotless.dev/run/tests/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

// request is what a client sent: all that the API server sees of it.
type request struct {
	Method, URL, Accept, ContentType, UserAgent string
	Body                                        []byte
}

// recorder keeps the requests through a transport.
type recorder struct {
	mu   sync.Mutex
	reqs []request
}

func (r *recorder) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		var body []byte
		if req.Body != nil {
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return nil, err
			}
			req.Body.Close()
			body = b
			req.Body = io.NopCloser(bytes.NewReader(b))
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, request{req.Method, req.URL.String(), req.Header.Get("Accept"), req.Header.Get("Content-Type"), req.Header.Get("User-Agent"), body})
		r.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

func (r *recorder) take() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestSameRequestsAsClientset makes each call the runner makes (the
// executor, kubecred, kubeexec, the health check) once through
// client-go's clientset and once through kubeclient, against the test
// cluster, and wants the same requests on the wire — method, URL with
// its query, Accept, Content-Type, User-Agent, body — and the same
// answer: what the API server sees cannot tell the two apart. The
// clientset is told to speak JSON, as kubeclient does unasked; no
// request of kubeclient's asks for protobuf.
func TestSameRequestsAsClientset(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := t.Context()
	ns := c.Namespace

	var fullRec, narrowRec recorder
	fullCfg, narrowCfg := rest.CopyConfig(c.Config), rest.CopyConfig(c.Config)
	fullCfg.Wrap(fullRec.wrap)
	narrowCfg.Wrap(narrowRec.wrap)
	for _, cfg := range []*rest.Config{fullCfg, narrowCfg} {
		cfg.UserAgent = "knotless-run"
		cfg.QPS, cfg.Burst = 50, 100
	}
	fullCfg.ContentType = kubeclient.ContentTypeJSON // narrowCfg names none
	full, err := kubernetes.NewForConfig(fullCfg)
	if err != nil {
		t.Fatal(err)
	}
	narrow, err := kubeclient.NewForConfig(narrowCfg)
	if err != nil {
		t.Fatal(err)
	}

	// An object that exists, for the calls that need one.
	if _, err := c.Clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: ns}, Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: c.Image}},
	}}}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np", Namespace: ns}, Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}}
	zero := intstr.FromInt32(0)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "pdb", Namespace: ns}, Spec: policyv1.PodDisruptionBudgetSpec{
		MaxUnavailable: &zero, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"batch.kubernetes.io/job-name": "job"}}}}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "role", Namespace: ns}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rb", Namespace: ns}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "role"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "sa", Namespace: ns}}}
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: "batch", Resource: "jobs"}}}
	seconds := int64(600)
	token := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}
	apply := []byte(`{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingAdmissionPolicy","metadata":{"name":"knotless-kubeclient-test"},"spec":{"validations":[{"expression":"true"}]}}`)
	force := true
	applyOpts := metav1.PatchOptions{FieldManager: "knotless-run", Force: &force, DryRun: []string{metav1.DryRunAll}}
	background := metav1.DeletePropagationBackground
	node := c.Info.NodeName

	// Each call twice; same: the answers are compared too (not for
	// those that differ by nature: a token, a fresh uid).
	type call struct {
		name   string
		full   func() (any, error)
		narrow func() (any, error)
		same   bool // compare the answers too
	}
	calls := []call{
		{"get namespace",
			func() (any, error) { return full.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}) },
			func() (any, error) { return narrow.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}) }, true},
		{"create namespace (dry run, exists)",
			func() (any, error) {
				return full.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, dry)
			},
			func() (any, error) {
				return narrow.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, dry)
			}, true},
		{"merge-patch namespace (dry run)",
			func() (any, error) {
				return full.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			},
			func() (any, error) {
				return narrow.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			}, false},
		{"get node",
			func() (any, error) { return full.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}) },
			func() (any, error) { return narrow.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}) }, false},
		{"get missing node",
			func() (any, error) { return full.CoreV1().Nodes().Get(ctx, "no-such-node", metav1.GetOptions{}) },
			func() (any, error) { return narrow.CoreV1().Nodes().Get(ctx, "no-such-node", metav1.GetOptions{}) }, true},
		{"list pods by label",
			func() (any, error) {
				return full.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=job"})
			},
			func() (any, error) {
				return narrow.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=job"})
			}, false},
		{"get missing pod",
			func() (any, error) { return full.CoreV1().Pods(ns).Get(ctx, "pod", metav1.GetOptions{}) },
			func() (any, error) { return narrow.CoreV1().Pods(ns).Get(ctx, "pod", metav1.GetOptions{}) }, true},
		{"delete missing pod",
			func() (any, error) {
				grace := int64(0)
				return nil, full.CoreV1().Pods(ns).Delete(ctx, "pod", metav1.DeleteOptions{GracePeriodSeconds: &grace})
			},
			func() (any, error) {
				grace := int64(0)
				return nil, narrow.CoreV1().Pods(ns).Delete(ctx, "pod", metav1.DeleteOptions{GracePeriodSeconds: &grace})
			}, true},
		{"watch pods",
			func() (any, error) {
				w, err := full.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=pod", ResourceVersion: "0"})
				if err == nil {
					w.Stop()
				}
				return nil, err
			},
			func() (any, error) {
				w, err := narrow.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=pod", ResourceVersion: "0"})
				if err == nil {
					w.Stop()
				}
				return nil, err
			}, true},
		{"list events",
			func() (any, error) {
				return full.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=pod"})
			},
			func() (any, error) {
				return narrow.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=pod"})
			}, false},
		{"create service account (dry run)",
			func() (any, error) {
				return full.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa2"}}, dry)
			},
			func() (any, error) {
				return narrow.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa2"}}, dry)
			}, false},
		{"create token",
			func() (any, error) {
				return full.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "sa", token, metav1.CreateOptions{})
			},
			func() (any, error) {
				return narrow.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "sa", token, metav1.CreateOptions{})
			}, false},
		{"create job (dry run)",
			func() (any, error) { return full.BatchV1().Jobs(ns).Create(ctx, job, dry) },
			func() (any, error) { return narrow.BatchV1().Jobs(ns).Create(ctx, job, dry) }, false},
		{"get missing job",
			func() (any, error) { return full.BatchV1().Jobs(ns).Get(ctx, "job", metav1.GetOptions{}) },
			func() (any, error) { return narrow.BatchV1().Jobs(ns).Get(ctx, "job", metav1.GetOptions{}) }, true},
		{"list jobs",
			func() (any, error) {
				return full.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=knotless-run"})
			},
			func() (any, error) {
				return narrow.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=knotless-run"})
			}, false},
		{"delete missing job",
			func() (any, error) {
				return nil, full.BatchV1().Jobs(ns).Delete(ctx, "job", metav1.DeleteOptions{PropagationPolicy: &background})
			},
			func() (any, error) {
				return nil, narrow.BatchV1().Jobs(ns).Delete(ctx, "job", metav1.DeleteOptions{PropagationPolicy: &background})
			}, true},
		{"create network policy (dry run)",
			func() (any, error) { return full.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, dry) },
			func() (any, error) { return narrow.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, dry) }, false},
		{"get missing network policy",
			func() (any, error) {
				return full.NetworkingV1().NetworkPolicies(ns).Get(ctx, "np", metav1.GetOptions{})
			},
			func() (any, error) {
				return narrow.NetworkingV1().NetworkPolicies(ns).Get(ctx, "np", metav1.GetOptions{})
			}, true},
		{"create pod disruption budget (dry run)",
			func() (any, error) { return full.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, dry) },
			func() (any, error) { return narrow.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, dry) }, false},
		{"list pod disruption budgets by label",
			func() (any, error) {
				return full.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=knotless-run"})
			},
			func() (any, error) {
				return narrow.PolicyV1().PodDisruptionBudgets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=knotless-run"})
			}, false},
		{"delete missing pod disruption budget",
			func() (any, error) {
				return nil, full.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "pdb", metav1.DeleteOptions{})
			},
			func() (any, error) {
				return nil, narrow.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "pdb", metav1.DeleteOptions{})
			}, true},
		{"create role (dry run)",
			func() (any, error) { return full.RbacV1().Roles(ns).Create(ctx, role, dry) },
			func() (any, error) { return narrow.RbacV1().Roles(ns).Create(ctx, role, dry) }, false},
		{"update missing role",
			func() (any, error) { return full.RbacV1().Roles(ns).Update(ctx, role, metav1.UpdateOptions{}) },
			func() (any, error) { return narrow.RbacV1().Roles(ns).Update(ctx, role, metav1.UpdateOptions{}) }, true},
		{"create role binding (dry run)",
			func() (any, error) { return full.RbacV1().RoleBindings(ns).Create(ctx, binding, dry) },
			func() (any, error) { return narrow.RbacV1().RoleBindings(ns).Create(ctx, binding, dry) }, false},
		{"access review",
			func() (any, error) {
				return full.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			},
			func() (any, error) {
				return narrow.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			}, true},
		{"apply admission policy (dry run)",
			func() (any, error) {
				return full.AdmissionregistrationV1().ValidatingAdmissionPolicies().Patch(ctx, "knotless-kubeclient-test", types.ApplyPatchType, apply, applyOpts)
			},
			func() (any, error) {
				return narrow.AdmissionregistrationV1().ValidatingAdmissionPolicies().Patch(ctx, "knotless-kubeclient-test", types.ApplyPatchType, apply, applyOpts)
			}, false},
		{"get missing admission policy binding",
			func() (any, error) {
				return full.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "knotless-kubeclient-test", metav1.GetOptions{})
			},
			func() (any, error) {
				return narrow.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "knotless-kubeclient-test", metav1.GetOptions{})
			}, true},
		// The discovery client's decoder keeps the list's kind; the
		// typed clients' drops it, as for every typed object.
		{"discovery of admissionregistration.k8s.io/v1",
			func() (any, error) {
				return resources(full.Discovery().ServerResourcesForGroupVersion("admissionregistration.k8s.io/v1"))
			},
			func() (any, error) {
				return resources(kubeclient.ServerResourcesForGroupVersion(ctx, narrow.AdmissionregistrationV1().RESTClient(), "admissionregistration.k8s.io/v1"))
			}, true},
		{"discovery of a group not served",
			func() (any, error) { return full.Discovery().ServerResourcesForGroupVersion("knotless.dev/v1") },
			func() (any, error) {
				return kubeclient.ServerResourcesForGroupVersion(ctx, narrow.AdmissionregistrationV1().RESTClient(), "knotless.dev/v1")
			}, true},
		{"readyz",
			func() (any, error) {
				b, err := full.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
				return string(b), err
			},
			func() (any, error) {
				b, err := narrow.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
				return string(b), err
			}, true},
	}
	for _, cl := range calls {
		fullAns, fullErr := cl.full()
		fullReqs := fullRec.take()
		narrowAns, narrowErr := cl.narrow()
		narrowReqs := narrowRec.take()
		if len(fullReqs) == 0 {
			t.Errorf("%s: the clientset sent nothing", cl.name)
		}
		for _, r := range narrowReqs {
			if strings.Contains(r.Accept, "protobuf") || strings.Contains(r.ContentType, "protobuf") {
				t.Errorf("%s: kubeclient asked for protobuf: %s", cl.name, show([]request{r}))
			}
		}
		if !slices.EqualFunc(fullReqs, narrowReqs, func(a, b request) bool { return reflect.DeepEqual(a, b) }) {
			t.Errorf("%s: requests differ:\nclientset  %s\nkubeclient %s", cl.name, show(fullReqs), show(narrowReqs))
		}
		if (fullErr == nil) != (narrowErr == nil) || fullErr != nil && (apierrors.ReasonForError(fullErr) != apierrors.ReasonForError(narrowErr) || fullErr.Error() != narrowErr.Error()) {
			t.Errorf("%s: errors differ: clientset %v, kubeclient %v", cl.name, fullErr, narrowErr)
		}
		if cl.same && fullErr == nil && !reflect.DeepEqual(fullAns, narrowAns) {
			t.Errorf("%s: answers differ:\nclientset  %#v\nkubeclient %#v", cl.name, fullAns, narrowAns)
		}
		if fullErr == nil && fullAns != nil && reflect.TypeOf(fullAns) != reflect.TypeOf(narrowAns) {
			t.Errorf("%s: answer types differ: %T, %T", cl.name, fullAns, narrowAns)
		}
	}

	// kubeexec's exec URL: the options as query parameters.
	opts := &corev1.PodExecOptions{Container: "run", Command: []string{"sh", "-c", "echo hi"}, Stdin: true, Stdout: true, Stderr: true}
	fullURL := full.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name("pod").SubResource("exec").VersionedParams(opts, scheme.ParameterCodec).URL()
	narrowURL := narrow.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name("pod").SubResource("exec").VersionedParams(opts, kubeclient.ParameterCodec).URL()
	if fullURL.String() != narrowURL.String() {
		t.Errorf("exec URL: clientset %s, kubeclient %s", fullURL, narrowURL)
	}
	if !strings.Contains(narrowURL.RawQuery, "command=echo+hi") {
		t.Errorf("exec URL %s: no command parameter", narrowURL)
	}
}

// resources is a discovery answer but its TypeMeta.
func resources(list *metav1.APIResourceList, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return struct {
		GroupVersion string
		Resources    []metav1.APIResource
	}{list.GroupVersion, list.APIResources}, nil
}

func show(reqs []request) string {
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "[%s %s accept=%q type=%q ua=%q body=%d bytes] ", r.Method, r.URL, r.Accept, r.ContentType, r.UserAgent, len(r.Body))
	}
	return b.String()
}

// TestSchemeGroups: the scheme holds exactly the groups the runner
// uses, and the option and discovery types every group needs.
func TestSchemeGroups(t *testing.T) {
	t.Parallel()
	groups := map[string]bool{}
	for gvk := range kubeclient.Scheme.AllKnownTypes() {
		if gvk.Version != runtime.APIVersionInternal {
			groups[gvk.GroupVersion().String()] = true
		}
	}
	got := slices.Sorted(maps.Keys(groups))
	want := []string{"admissionregistration.k8s.io/v1", "authentication.k8s.io/v1", "authorization.k8s.io/v1", "batch/v1", "coordination.k8s.io/v1", "networking.k8s.io/v1", "policy/v1", "rbac.authorization.k8s.io/v1", "v1"}
	if !slices.Equal(got, want) {
		t.Errorf("scheme groups %v, want %v", got, want)
	}
	for _, obj := range []runtime.Object{&metav1.ListOptions{}, &corev1.PodExecOptions{}, &metav1.APIResourceList{}, &metav1.Status{}} {
		if _, _, err := kubeclient.Scheme.ObjectKinds(obj); err != nil {
			t.Errorf("%T not in the scheme: %v", obj, err)
		}
	}
}
