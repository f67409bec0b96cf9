// Package kubecred mints and checks the runner's scoped cluster
// credential: a namespaced ServiceAccount bound to a Role that grants
// exactly what the Kubernetes executor uses, with a TokenRequest token of
// bounded life written into a kubeconfig.
package kubecred

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"knotless.dev/run/internal/kube/kubeclient"
	"knotless.dev/run/internal/lib/atomicfile"
)

// Rules are everything the Kubernetes executor does, and nothing else: no
// secrets, no nodes, nothing cluster-wide.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		// patch: a run takes a warm Job (serve --warm-pods) by labelling
		// it; the admission policy checks the Job's shape on update too.
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "list", "watch", "delete", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		// get is what the API server checks for a WebSocket exec upgrade.
		{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create", "get"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list", "watch"}},
		// update: a policy with the runner's name but another spec is
		// replaced, not trusted.
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"create", "get", "update"}},
		// Each run's disruption budget: made with its Job, deleted at its
		// end, swept (list) at start. Never evict, never update one.
		{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"create", "delete", "list"}},
		// serve --replicas: each replica's Lease, renewed, read by the
		// others, given back at its stop (internal/kube/replicas).
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "list", "update", "delete"}},
		// serve --replicas: each run's checkpoint beside its Job (owned
		// by it, collected with it), for a survivor of its driver.
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "get", "update"}},
	}
}

// Options say what to mint.
type Options struct {
	Namespace      string
	ServiceAccount string
	Duration       time.Duration
	// PodSecurity is the Pod Security level the namespace enforces:
	// "restricted" (the default) or "baseline" (for runners that run
	// steps as root).
	PodSecurity string
	// ImagePullSecrets are the Secret names the admission policy lets
	// run pods give in imagePullSecrets.
	ImagePullSecrets []string
}

// Pod Security admission labels of the runs namespace.
const (
	LabelPodSecurityEnforce        = "pod-security.kubernetes.io/enforce"
	LabelPodSecurityEnforceVersion = "pod-security.kubernetes.io/enforce-version"
	// warn makes the API server tell whoever creates a Job whose pods
	// would be refused (enforce checks only the pods themselves).
	LabelPodSecurityWarn        = "pod-security.kubernetes.io/warn"
	LabelPodSecurityWarnVersion = "pod-security.kubernetes.io/warn-version"
)

// PodSecurityLevel checks a level, "" meaning restricted.
func PodSecurityLevel(level string) (string, error) {
	switch level {
	case "":
		return "restricted", nil
	case "restricted", "baseline":
		return level, nil
	}
	return "", fmt.Errorf("pod security level %q: want restricted or baseline", level)
}

// NamespaceLabels are the labels of the runs namespace: a stolen runner
// credential can only make Jobs whose pods pass the level.
func NamespaceLabels(level string) map[string]string {
	l := Labels()
	maps.Copy(l, podSecurityLabels(level))
	return l
}

func podSecurityLabels(level string) map[string]string {
	return map[string]string{
		LabelPodSecurityEnforce: level, LabelPodSecurityEnforceVersion: "latest",
		LabelPodSecurityWarn: level, LabelPodSecurityWarnVersion: "latest",
	}
}

// Check is one access question and its answer.
type Check struct {
	Verb, Group, Resource, Subresource string
	// Cluster is set for a cluster-wide resource: asked without a
	// namespace.
	Cluster   bool
	Want, Got bool
}

func (c Check) String() string {
	r := c.Resource
	if c.Subresource != "" {
		r += "/" + c.Subresource
	}
	return fmt.Sprintf("%s %s", c.Verb, r)
}

// Checks are the questions a fresh credential must answer right.
func Checks() []Check {
	return []Check{
		{Verb: "create", Group: "batch", Resource: "jobs", Want: true},
		{Verb: "create", Resource: "pods", Subresource: "exec", Want: true},
		{Verb: "create", Group: "networking.k8s.io", Resource: "networkpolicies", Want: true},
		{Verb: "update", Group: "networking.k8s.io", Resource: "networkpolicies", Want: true},
		{Verb: "create", Group: "policy", Resource: "poddisruptionbudgets", Want: true},
		{Verb: "delete", Group: "policy", Resource: "poddisruptionbudgets", Want: true},
		{Verb: "list", Group: "policy", Resource: "poddisruptionbudgets", Want: true},
		{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Want: true},
		// A budget is the runner's to make and remove, not to loosen, and
		// it evicts nothing.
		{Verb: "update", Group: "policy", Resource: "poddisruptionbudgets", Want: false},
		{Verb: "create", Resource: "pods", Subresource: "eviction", Want: false},
		// Pods come only from Jobs, admitted under the namespace's Pod
		// Security level.
		{Verb: "create", Resource: "pods", Want: false},
		{Verb: "get", Resource: "nodes", Cluster: true, Want: false},
		{Verb: "get", Resource: "secrets", Want: false},
		// The admission policy that keeps its Jobs from Secrets is the
		// operator's: the runner can neither loosen nor remove it.
		{Verb: "update", Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies", Cluster: true, Want: false},
		{Verb: "patch", Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies", Cluster: true, Want: false},
		{Verb: "delete", Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies", Cluster: true, Want: false},
		{Verb: "update", Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicybindings", Cluster: true, Want: false},
		{Verb: "patch", Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicybindings", Cluster: true, Want: false},
		{Verb: "delete", Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicybindings", Cluster: true, Want: false},
	}
}

// Labels mark what knotless-run made.
func Labels() map[string]string {
	return map[string]string{"app.kubernetes.io/managed-by": "knotless-run"}
}

// Ensure creates or updates the namespace, ServiceAccount, Role and
// RoleBinding. It is idempotent and safe to run concurrently: a create
// that loses a race becomes an update.
func Ensure(ctx context.Context, cs *kubeclient.Clientset, o Options) error {
	// An admin scoped to an existing namespace may not create namespaces:
	// that only matters when the namespace turns out to be missing.
	level, err := PodSecurityLevel(o.PodSecurity)
	if err != nil {
		return err
	}
	var nsErr error
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace, Labels: NamespaceLabels(level)}}
	_, err = cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		if err := labelNamespace(ctx, cs, o.Namespace, level); err != nil {
			return err
		}
	case apierrors.IsForbidden(err):
		nsErr = permission(err, "create", "namespaces", o.Namespace)
		if err := labelNamespace(ctx, cs, o.Namespace, level); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	case err != nil:
		return permission(err, "create", "namespaces", o.Namespace)
	}
	sa := &corev1.ServiceAccount{
		ObjectMeta:                   metav1.ObjectMeta{Name: o.ServiceAccount, Namespace: o.Namespace, Labels: Labels()},
		AutomountServiceAccountToken: ptr(false),
	}
	if _, err := cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		if apierrors.IsNotFound(err) && nsErr != nil {
			return nsErr
		}
		return permission(err, "create", "serviceaccounts", o.Namespace)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: o.ServiceAccount, Namespace: o.Namespace, Labels: Labels()}, Rules: Rules()}
	if err := createOrUpdate(ctx, "roles", o.Namespace,
		func() error {
			_, err := cs.RbacV1().Roles(o.Namespace).Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().Roles(o.Namespace).Update(ctx, role, metav1.UpdateOptions{})
			return err
		},
	); err != nil {
		return err
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: o.ServiceAccount, Namespace: o.Namespace, Labels: Labels()},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: o.ServiceAccount, Namespace: o.Namespace}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: o.ServiceAccount},
	}
	return createOrUpdate(ctx, "rolebindings", o.Namespace,
		func() error {
			_, err := cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, binding, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().RoleBindings(o.Namespace).Update(ctx, binding, metav1.UpdateOptions{})
			return err
		},
	)
}

// labelNamespace sets the Pod Security labels on an existing namespace
// (a merge patch: other labels stay). A namespace labelled already needs
// no right beyond get.
func labelNamespace(ctx context.Context, cs *kubeclient.Clientset, name, level string) error {
	want := podSecurityLabels(level)
	if have, err := cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); err == nil {
		missing := false
		for k, v := range want {
			missing = missing || have.Labels[k] != v
		}
		if !missing {
			return nil
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": want}})
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsForbidden(err) {
			return fmt.Errorf("the admin credential may not patch namespace %s to label it %s=%s (RBAC; label it yourself): %w", name, LabelPodSecurityEnforce, level, err)
		}
		return fmt.Errorf("label namespace %s %s=%s: %w", name, LabelPodSecurityEnforce, level, err)
	}
	return nil
}

func createOrUpdate(ctx context.Context, resource, ns string, create, update func() error) error {
	err := create()
	if apierrors.IsAlreadyExists(err) {
		if err = update(); err != nil {
			return permission(err, "update", resource, ns)
		}
		return nil
	}
	if err != nil {
		return permission(err, "create", resource, ns)
	}
	return nil
}

// permission names the missing right when the admin credential lacks it.
func permission(err error, verb, resource, ns string) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("the admin credential may not %s %s in namespace %s (RBAC): %w", verb, resource, ns, err)
	}
	return fmt.Errorf("%s %s in namespace %s: %w", verb, resource, ns, err)
}

// Mint requests a token for the ServiceAccount and returns a kubeconfig
// that uses it with the admin context's server and CA.
func Mint(ctx context.Context, cs *kubeclient.Clientset, admin *rest.Config, o Options) (*clientcmdapi.Config, time.Time, error) {
	seconds := int64(o.Duration / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(o.Namespace).CreateToken(ctx, o.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, time.Time{}, permission(err, "create", "serviceaccounts/token", o.Namespace)
	}
	ca := admin.CAData
	if len(ca) == 0 && admin.CAFile != "" {
		if ca, err = os.ReadFile(admin.CAFile); err != nil {
			return nil, time.Time{}, fmt.Errorf("read the admin context's CA %s: %w", admin.CAFile, err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cluster"] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthorityData: ca, InsecureSkipTLSVerify: admin.Insecure, TLSServerName: admin.ServerName}
	kc.AuthInfos[o.ServiceAccount] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["knotless-run"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: o.ServiceAccount, Namespace: o.Namespace}
	kc.CurrentContext = "knotless-run"
	return kc, tr.Status.ExpirationTimestamp.Time, nil
}

// Verify asks the API server, as the credential itself, each of Checks.
// It returns the answers and an error naming every wrong one.
func Verify(ctx context.Context, cfg *rest.Config, ns string) ([]Check, error) {
	cs, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	checks := Checks()
	var wrong []string
	for i, c := range checks {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: c.Verb, Group: c.Group, Resource: c.Resource, Subresource: c.Subresource},
		}}
		if c.Cluster {
			review.Spec.ResourceAttributes.Namespace = ""
		}
		got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return checks, fmt.Errorf("access review %q: %w", c, err)
		}
		checks[i].Got = got.Status.Allowed
		if checks[i].Got != c.Want {
			wrong = append(wrong, fmt.Sprintf("%s: allowed=%v, want %v", c, checks[i].Got, c.Want))
		}
	}
	if len(wrong) > 0 {
		return checks, fmt.Errorf("the new credential fails its checks: %s", strings.Join(wrong, "; "))
	}
	return checks, nil
}

// VerifySettled is Verify for a credential whose Role and RoleBinding
// were just created or changed: the API server's authorizer learns of
// them from a watch, so a right granted a moment ago may still be
// denied. While the only wrong answers are rights not yet granted, it
// asks again, for up to settle; a right the credential must not have is
// never waited out.
func VerifySettled(ctx context.Context, cfg *rest.Config, ns string, settle time.Duration) ([]Check, error) {
	deadline := time.Now().Add(settle)
	wait := 100 * time.Millisecond
	for {
		checks, err := Verify(ctx, cfg, ns)
		if err == nil || !onlyMissing(checks) || time.Now().Add(wait).After(deadline) {
			return checks, err
		}
		select {
		case <-ctx.Done():
			return checks, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// onlyMissing reports whether every wrong answer is a right not (yet)
// granted, none a right the credential must not have.
func onlyMissing(checks []Check) bool {
	for _, c := range checks {
		if c.Got != c.Want && !c.Want {
			return false
		}
	}
	return true
}

// TokenExpiry reads the exp claim of a JWT without verifying it: the
// file's mtime says nothing about when its token dies.
func TokenExpiry(token string) (time.Time, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, errors.New("token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("decode token payload: %w", err)
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, fmt.Errorf("decode token claims: %w", err)
	}
	if claims.Exp == 0 {
		return time.Time{}, errors.New("token has no exp claim")
	}
	return time.Unix(claims.Exp, 0).UTC(), nil
}

// ErrExpired is returned for a credential whose token has expired.
var ErrExpired = errors.New("runner credentials expired")

// Token returns the bearer token cfg sends now: the current content of
// its BearerTokenFile when it has one (a projected service-account token
// or a kubeconfig tokenFile, which the kubelet or a timer rotates and
// client-go's transport re-reads), else its BearerToken.
func Token(cfg *rest.Config) (string, error) {
	if cfg.BearerTokenFile == "" {
		return cfg.BearerToken, nil
	}
	b, err := os.ReadFile(cfg.BearerTokenFile)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// CheckExpiry returns an error wrapping ErrExpired when the token of cfg
// has expired, and the expiry (zero when the config has no JWT). A token
// file is read now: a rotated token is judged by its own exp, not by the
// one read when the config was loaded.
func CheckExpiry(cfg *rest.Config, now time.Time) (time.Time, error) {
	token, err := Token(cfg)
	if err != nil {
		return time.Time{}, err
	}
	if token == "" {
		return time.Time{}, nil
	}
	exp, err := TokenExpiry(token)
	if err != nil {
		return time.Time{}, nil // not a JWT: nothing to say about its life
	}
	if !now.Before(exp) {
		return exp, fmt.Errorf("%w at %s; the refresh timer may have failed", ErrExpired, exp.Format(time.RFC3339))
	}
	return exp, nil
}

// WriteKubeconfig writes kc to path atomically (atomicfile.Write). The
// file is mode 0600.
func WriteKubeconfig(path string, kc *clientcmdapi.Config) error {
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return fmt.Errorf("encode kubeconfig: %w", err)
	}
	return atomicfile.Write(path, data, 0o600)
}

func ptr[T any](v T) *T { return &v }
