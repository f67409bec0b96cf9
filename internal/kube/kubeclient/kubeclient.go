// Package kubeclient is the runner's Kubernetes API client: client-go's
// generic typed clients (k8s.io/client-go/gentype) over a scheme that
// holds only the API groups knotless-run uses, in the shape of
// client-go's clientset (cs.CoreV1().Pods(ns).Get(...)).
//
// client-go's own clientset (k8s.io/client-go/kubernetes) links the
// typed clients of every built-in API group, and its scheme
// (k8s.io/client-go/kubernetes/scheme) registers all of them as the
// process starts: about 60 API group versions of types, their
// initialisation and their code, which a long-running daemon keeps
// resident for nothing (docs/performance.md, "serve's memory"). The
// clients here are built as client-gen builds the clientset's — the
// same REST paths, the same parameter codec, one HTTP client and one
// rate limiter shared by every group — so requests are the ones the
// clientset would send given the same configuration, but for the
// content type: JSON unless the configuration names one
// (ContentTypeJSON says why). Tests may use the
// full clientset; internal/archtest keeps it out of the binary.
package kubeclient

import (
	"context"
	"fmt"
	"net/http"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Scheme holds the API groups the runner uses, as client-go's
// kubernetes/scheme.Scheme holds all of them.
var Scheme = runtime.NewScheme()

// Codecs are Scheme's serializers.
var Codecs = serializer.NewCodecFactory(Scheme)

// ParameterCodec encodes options (ListOptions, PodExecOptions, ...) as
// query parameters.
var ParameterCodec = runtime.NewParameterCodec(Scheme)

func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	groups := runtime.NewSchemeBuilder(
		admissionregistrationv1.AddToScheme,
		authenticationv1.AddToScheme,
		authorizationv1.AddToScheme,
		batchv1.AddToScheme,
		coordinationv1.AddToScheme,
		corev1.AddToScheme,
		networkingv1.AddToScheme,
		policyv1.AddToScheme,
		rbacv1.AddToScheme,
	)
	utilruntime.Must(groups.AddToScheme(Scheme))
}

// ContentTypeJSON is what the runner's requests and answers are encoded
// as. The clientset prefers protobuf, whose generated code is per type:
// decoding the core group's Pods, Jobs and Events and encoding a Job
// made 1.25 MB of k8s.io/api/core/v1's code and about as much of its
// function table resident for good after a daemon's first runs (read
// from /proc/PID/pagemap; docs/performance.md). JSON decodes every type
// through the same reflection code, a little more processor time per
// object for the few objects a run reads.
const ContentTypeJSON = runtime.ContentTypeJSON

// Clientset has a REST client per API group version the runner uses.
type Clientset struct {
	core, batch, coordination, networking, policy, rbac, authorization, admissionregistration rest.Interface
}

// NewForConfig is kubernetes.NewForConfig for these groups: the
// default user agent when c names none, one HTTP client for every
// group, and one token-bucket rate limiter from c's QPS and Burst when
// c has no RateLimiter. Unlike the clientset it speaks JSON when c
// names no content type (ContentTypeJSON).
func NewForConfig(c *rest.Config) (*Clientset, error) {
	cfg := *c
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if cfg.ContentType == "" {
		cfg.ContentType = ContentTypeJSON
	}
	httpClient, err := rest.HTTPClientFor(&cfg)
	if err != nil {
		return nil, err
	}
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		if cfg.Burst <= 0 {
			return nil, fmt.Errorf("burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	var cs Clientset
	for _, g := range []struct {
		client *rest.Interface
		gv     schema.GroupVersion
	}{
		{&cs.core, corev1.SchemeGroupVersion},
		{&cs.batch, batchv1.SchemeGroupVersion},
		{&cs.coordination, coordinationv1.SchemeGroupVersion},
		{&cs.networking, networkingv1.SchemeGroupVersion},
		{&cs.policy, policyv1.SchemeGroupVersion},
		{&cs.rbac, rbacv1.SchemeGroupVersion},
		{&cs.authorization, authorizationv1.SchemeGroupVersion},
		{&cs.admissionregistration, admissionregistrationv1.SchemeGroupVersion},
	} {
		if *g.client, err = restClient(cfg, g.gv, httpClient); err != nil {
			return nil, err
		}
	}
	return &cs, nil
}

// restClient is the typed client's setConfigDefaults and
// NewForConfigAndClient: gv's path, this scheme's codecs.
func restClient(cfg rest.Config, gv schema.GroupVersion, h *http.Client) (*rest.RESTClient, error) {
	cfg.GroupVersion = &gv
	cfg.APIPath = "/apis"
	if gv.Group == "" {
		cfg.APIPath = "/api"
	}
	cfg.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, Codecs).WithoutConversion()
	return rest.RESTClientForConfigAndClient(&cfg, h)
}

// CoreV1 is the core group's client (client-go's CoreV1Interface).
type CoreV1 struct{ client rest.Interface }

// CoreV1 returns the core group's client.
func (c *Clientset) CoreV1() CoreV1 { return CoreV1{c.core} }

// RESTClient is the core group's REST client (for subresources such as
// pods/exec, and paths such as /readyz).
func (c CoreV1) RESTClient() rest.Interface { return c.client }

// Pods are namespace's pods.
func (c CoreV1) Pods(namespace string) *gentype.ClientWithList[*corev1.Pod, *corev1.PodList] {
	return newClient(c.client, "pods", namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })
}

// Nodes are the cluster's nodes.
func (c CoreV1) Nodes() *gentype.ClientWithList[*corev1.Node, *corev1.NodeList] {
	return newClient(c.client, "nodes", "",
		func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} })
}

// Events are namespace's events.
func (c CoreV1) Events(namespace string) *gentype.ClientWithList[*corev1.Event, *corev1.EventList] {
	return newClient(c.client, "events", namespace,
		func() *corev1.Event { return &corev1.Event{} }, func() *corev1.EventList { return &corev1.EventList{} })
}

// ConfigMaps are namespace's config maps.
func (c CoreV1) ConfigMaps(namespace string) *gentype.ClientWithList[*corev1.ConfigMap, *corev1.ConfigMapList] {
	return newClient(c.client, "configmaps", namespace,
		func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} })
}

// Namespaces are the cluster's namespaces.
func (c CoreV1) Namespaces() *gentype.ClientWithList[*corev1.Namespace, *corev1.NamespaceList] {
	return newClient(c.client, "namespaces", "",
		func() *corev1.Namespace { return &corev1.Namespace{} }, func() *corev1.NamespaceList { return &corev1.NamespaceList{} })
}

// ServiceAccounts are namespace's service accounts.
func (c CoreV1) ServiceAccounts(namespace string) ServiceAccounts {
	return ServiceAccounts{newClient(c.client, "serviceaccounts", namespace,
		func() *corev1.ServiceAccount { return &corev1.ServiceAccount{} },
		func() *corev1.ServiceAccountList { return &corev1.ServiceAccountList{} })}
}

// ServiceAccounts is the service accounts' client with its token
// subresource.
type ServiceAccounts struct {
	*gentype.ClientWithList[*corev1.ServiceAccount, *corev1.ServiceAccountList]
}

// CreateToken requests a token for the service account name, as
// client-go's ServiceAccountInterface.CreateToken does.
func (c ServiceAccounts) CreateToken(ctx context.Context, name string, tr *authenticationv1.TokenRequest, opts metav1.CreateOptions) (*authenticationv1.TokenRequest, error) {
	result := &authenticationv1.TokenRequest{}
	err := c.GetClient().Post().
		UseProtobufAsDefault().
		Namespace(c.GetNamespace()).
		Resource("serviceaccounts").
		Name(name).
		SubResource("token").
		VersionedParams(&opts, ParameterCodec).
		Body(tr).
		Do(ctx).
		Into(result)
	return result, err
}

// BatchV1 is the batch/v1 group's client.
type BatchV1 struct{ client rest.Interface }

// BatchV1 returns the batch/v1 group's client.
func (c *Clientset) BatchV1() BatchV1 { return BatchV1{c.batch} }

// Jobs are namespace's Jobs.
func (c BatchV1) Jobs(namespace string) *gentype.ClientWithList[*batchv1.Job, *batchv1.JobList] {
	return newClient(c.client, "jobs", namespace,
		func() *batchv1.Job { return &batchv1.Job{} }, func() *batchv1.JobList { return &batchv1.JobList{} })
}

// CoordinationV1 is the coordination.k8s.io group's client: the
// replicas' Leases (internal/kube/replicas).
type CoordinationV1 struct{ client rest.Interface }

// CoordinationV1 returns the coordination group's client.
func (c *Clientset) CoordinationV1() CoordinationV1 { return CoordinationV1{c.coordination} }

// Leases are namespace's leases.
func (c CoordinationV1) Leases(namespace string) *gentype.ClientWithList[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return newClient(c.client, "leases", namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} }, func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
}

// NetworkingV1 is the networking.k8s.io/v1 group's client.
type NetworkingV1 struct{ client rest.Interface }

// NetworkingV1 returns the networking.k8s.io/v1 group's client.
func (c *Clientset) NetworkingV1() NetworkingV1 { return NetworkingV1{c.networking} }

// NetworkPolicies are namespace's network policies.
func (c NetworkingV1) NetworkPolicies(namespace string) *gentype.ClientWithList[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList] {
	return newClient(c.client, "networkpolicies", namespace,
		func() *networkingv1.NetworkPolicy { return &networkingv1.NetworkPolicy{} },
		func() *networkingv1.NetworkPolicyList { return &networkingv1.NetworkPolicyList{} })
}

// PolicyV1 is the policy/v1 group's client.
type PolicyV1 struct{ client rest.Interface }

// PolicyV1 returns the policy/v1 group's client.
func (c *Clientset) PolicyV1() PolicyV1 { return PolicyV1{c.policy} }

// PodDisruptionBudgets are namespace's pod disruption budgets.
func (c PolicyV1) PodDisruptionBudgets(namespace string) *gentype.ClientWithList[*policyv1.PodDisruptionBudget, *policyv1.PodDisruptionBudgetList] {
	return newClient(c.client, "poddisruptionbudgets", namespace,
		func() *policyv1.PodDisruptionBudget { return &policyv1.PodDisruptionBudget{} },
		func() *policyv1.PodDisruptionBudgetList { return &policyv1.PodDisruptionBudgetList{} })
}

// RbacV1 is the rbac.authorization.k8s.io/v1 group's client.
type RbacV1 struct{ client rest.Interface }

// RbacV1 returns the rbac.authorization.k8s.io/v1 group's client.
func (c *Clientset) RbacV1() RbacV1 { return RbacV1{c.rbac} }

// Roles are namespace's Roles.
func (c RbacV1) Roles(namespace string) *gentype.ClientWithList[*rbacv1.Role, *rbacv1.RoleList] {
	return newClient(c.client, "roles", namespace,
		func() *rbacv1.Role { return &rbacv1.Role{} }, func() *rbacv1.RoleList { return &rbacv1.RoleList{} })
}

// RoleBindings are namespace's RoleBindings.
func (c RbacV1) RoleBindings(namespace string) *gentype.ClientWithList[*rbacv1.RoleBinding, *rbacv1.RoleBindingList] {
	return newClient(c.client, "rolebindings", namespace,
		func() *rbacv1.RoleBinding { return &rbacv1.RoleBinding{} },
		func() *rbacv1.RoleBindingList { return &rbacv1.RoleBindingList{} })
}

// AuthorizationV1 is the authorization.k8s.io/v1 group's client.
type AuthorizationV1 struct{ client rest.Interface }

// AuthorizationV1 returns the authorization.k8s.io/v1 group's client.
func (c *Clientset) AuthorizationV1() AuthorizationV1 { return AuthorizationV1{c.authorization} }

// SelfSubjectAccessReviews asks what the caller itself may do.
func (c AuthorizationV1) SelfSubjectAccessReviews() *gentype.Client[*authorizationv1.SelfSubjectAccessReview] {
	return gentype.NewClient("selfsubjectaccessreviews", c.client, ParameterCodec, "",
		func() *authorizationv1.SelfSubjectAccessReview { return &authorizationv1.SelfSubjectAccessReview{} },
		gentype.PrefersProtobuf[*authorizationv1.SelfSubjectAccessReview]())
}

// AdmissionregistrationV1 is the admissionregistration.k8s.io/v1
// group's client.
type AdmissionregistrationV1 struct{ client rest.Interface }

// AdmissionregistrationV1 returns the admissionregistration.k8s.io/v1
// group's client.
func (c *Clientset) AdmissionregistrationV1() AdmissionregistrationV1 {
	return AdmissionregistrationV1{c.admissionregistration}
}

// RESTClient is the group's REST client (for its discovery document).
func (c AdmissionregistrationV1) RESTClient() rest.Interface { return c.client }

// ValidatingAdmissionPolicies are the cluster's admission policies.
func (c AdmissionregistrationV1) ValidatingAdmissionPolicies() *gentype.ClientWithList[*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyList] {
	return newClient(c.client, "validatingadmissionpolicies", "",
		func() *admissionregistrationv1.ValidatingAdmissionPolicy {
			return &admissionregistrationv1.ValidatingAdmissionPolicy{}
		},
		func() *admissionregistrationv1.ValidatingAdmissionPolicyList {
			return &admissionregistrationv1.ValidatingAdmissionPolicyList{}
		})
}

// ValidatingAdmissionPolicyBindings are the cluster's admission policy
// bindings.
func (c AdmissionregistrationV1) ValidatingAdmissionPolicyBindings() *gentype.ClientWithList[*admissionregistrationv1.ValidatingAdmissionPolicyBinding, *admissionregistrationv1.ValidatingAdmissionPolicyBindingList] {
	return newClient(c.client, "validatingadmissionpolicybindings", "",
		func() *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
			return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		},
		func() *admissionregistrationv1.ValidatingAdmissionPolicyBindingList {
			return &admissionregistrationv1.ValidatingAdmissionPolicyBindingList{}
		})
}

// ServerResourcesForGroupVersion is the API server's discovery document
// for gv, as client-go's discovery client asks for it (the group's path
// under /apis, or /api/v1 for the core group).
func ServerResourcesForGroupVersion(ctx context.Context, client rest.Interface, gv string) (*metav1.APIResourceList, error) {
	path := "/apis/" + gv
	if gv == "v1" {
		path = "/api/v1"
	}
	list := &metav1.APIResourceList{GroupVersion: gv}
	if err := client.Get().AbsPath(path).Do(ctx).Into(list); err != nil {
		return nil, err
	}
	return list, nil
}

// objectWithMeta is gentype's constraint on the objects it serves.
type objectWithMeta interface {
	runtime.Object
	metav1.Object
}

// newClient is what client-gen writes for a built-in resource: a
// typed client with lists that prefers protobuf.
func newClient[T objectWithMeta, L runtime.Object](client rest.Interface, resource, namespace string, obj func() T, list func() L) *gentype.ClientWithList[T, L] {
	return gentype.NewClientWithList(resource, client, ParameterCodec, namespace, obj, list, gentype.PrefersProtobuf[T]())
}
