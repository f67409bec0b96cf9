package kubecred

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	"knotless.dev/run/internal/kube/kubeclient"
)

// The runner's Role lets it create Jobs, and a Job may name any Secret of
// its namespace in a volume or in env: the missing secrets verb does not
// stop that. The admission policy here refuses, for the runner's service
// account only, every Job or Pod shape but the one the Kubernetes
// executor builds (BuildJob): emptyDir volumes, plain env, no host
// namespaces or ports, no service-account token, the restricted security
// context (or, for runners with --allow-root-steps, root with the
// capabilities of RootCapabilities), and only the pull Secrets the
// operator named.

// LabelServiceAccountNamespace is set on the policy and its binding
// (cluster-wide objects) to the namespace of the service account they
// are about, so they can be found from it.
const LabelServiceAccountNamespace = "dev.knotless.service-account-namespace"

// AdmissionGroupVersion serves the policy: Kubernetes 1.30 and later.
const AdmissionGroupVersion = "admissionregistration.k8s.io/v1"

// ErrNoAdmissionPolicy is returned by RequireAdmissionPolicy for an API
// server that does not serve ValidatingAdmissionPolicy.
var ErrNoAdmissionPolicy = errors.New("the API server does not serve " + AdmissionGroupVersion + " ValidatingAdmissionPolicy (Kubernetes 1.30 or later)")

// Policy says whose requests the admission policy checks and what it
// lets through.
type Policy struct {
	// Namespace and ServiceAccount are the runner's service account.
	Namespace      string
	ServiceAccount string
	// AllowRoot admits what the executor builds with --allow-root-steps:
	// the image's user (root) and RootCapabilities added.
	AllowRoot bool
	// ImagePullSecrets are the only Secret names run pods may give in
	// imagePullSecrets.
	ImagePullSecrets []string
}

// RootCapabilities are the capabilities a runner with --allow-root-steps
// adds to its steps' container, and the only ones the policy lets it add
// (a test in the Kubernetes executor keeps them equal).
func RootCapabilities() []corev1.Capability {
	return []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID"}
}

// PolicyName is the name of the admission policy and of its binding for
// a service account: knotless-run.NAMESPACE.NAME (a namespace holds no
// dot, so no two service accounts share it).
func PolicyName(namespace, serviceAccount string) string {
	return "knotless-run." + namespace + "." + serviceAccount
}

// Username is how the API server names a service account's requests.
func Username(namespace, serviceAccount string) string {
	return "system:serviceaccount:" + namespace + ":" + serviceAccount
}

// PolicyOf is the Policy that `knotless-run kubeconfig` installs for o:
// root allowed when the namespace enforces only baseline.
func PolicyOf(o Options) Policy {
	return Policy{Namespace: o.Namespace, ServiceAccount: o.ServiceAccount, AllowRoot: o.PodSecurity == "baseline", ImagePullSecrets: o.ImagePullSecrets}
}

// AdmissionPolicy returns the ValidatingAdmissionPolicy and its binding
// for p. Both are cluster-wide; the binding matches only requests of p's
// service account.
func AdmissionPolicy(p Policy) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	name := PolicyName(p.Namespace, p.ServiceAccount)
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return nil, nil, fmt.Errorf("admission policy name %q (from namespace %s and service account %s): %s", name, p.Namespace, p.ServiceAccount, strings.Join(msgs, "; "))
	}
	for _, s := range p.ImagePullSecrets {
		if msgs := validation.IsDNS1123Subdomain(s); len(msgs) > 0 {
			return nil, nil, fmt.Errorf("image pull secret %q: not a Secret name: %s", s, strings.Join(msgs, "; "))
		}
	}
	labels := Labels()
	labels[LabelServiceAccountNamespace] = p.Namespace
	meta := metav1.ObjectMeta{Name: name, Labels: labels}
	ops := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	rule := func(group, resource string) admissionregistrationv1.NamedRuleWithOperations {
		return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{resource}},
		}}
	}
	fail := admissionregistrationv1.Fail
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: AdmissionGroupVersion, Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{
				// Pods too, though the Role creates none: the Job
				// controller makes them as itself.
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{rule("batch", "jobs"), rule("", "pods")},
			},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name:       "runner-service-account",
				Expression: "request.userInfo.username == " + celString(Username(p.Namespace, p.ServiceAccount)),
			}},
			Variables:   policyVariables(p),
			Validations: policyValidations(),
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: AdmissionGroupVersion, Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: *meta.DeepCopy(),
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	return policy, binding, nil
}

// celString quotes s as a CEL string literal (the names it is used for
// hold no quote or backslash; strconv's Go quoting is CEL's as well).
func celString(s string) string { return strconv.Quote(s) }

func celStrings[S ~string](list []S) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = celString(string(s))
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func policyVariables(p Policy) []admissionregistrationv1.Variable {
	return []admissionregistrationv1.Variable{
		// The pod spec of a Job or a Pod. dyn: the same expressions are
		// type-checked against both kinds.
		{Name: "spec", Expression: "request.resource.resource == 'jobs' ? dyn(object.spec).template.spec : dyn(object.spec)"},
		{Name: "volumes", Expression: "variables.spec.?volumes.orValue([])"},
		{Name: "containers", Expression: "variables.spec.?containers.orValue([]) + variables.spec.?initContainers.orValue([]) + variables.spec.?ephemeralContainers.orValue([])"},
		{Name: "podRunAsNonRoot", Expression: "variables.spec.?securityContext.?runAsNonRoot.orValue(false)"},
		{Name: "podRunAsUser", Expression: "variables.spec.?securityContext.?runAsUser.orValue(-1)"},
		{Name: "podSeccomp", Expression: "variables.spec.?securityContext.?seccompProfile.?type.orValue('')"},
		{Name: "allowRoot", Expression: strconv.FormatBool(p.AllowRoot)},
		{Name: "rootCapabilities", Expression: celStrings(RootCapabilities())},
		{Name: "pullSecrets", Expression: celStrings(p.ImagePullSecrets)},
	}
}

// check is one validation: the expression, what the refusal says (the
// message expression names what was refused; the message is its
// fallback).
type check struct{ expr, messageExpr, message string }

// policyValidations are evaluated in order and the API server reports the
// first refusal: the specific ones (a Secret, a host path) come before
// the catch-alls (only emptyDir volumes, only plain env).
func policyValidations() []admissionregistrationv1.Validation {
	checks := []check{
		{
			"variables.volumes.all(v, !has(v.secret))",
			"variables.volumes.filter(v, has(v.secret)).map(v, 'volume ' + v.name + ' mounts Secret ' + v.secret.?secretName.orValue('')).join(', ') + ': the runner may not mount Secrets'",
			"a volume mounts a Secret: the runner may not mount Secrets",
		},
		{
			"variables.volumes.all(v, !has(v.projected) || v.projected.?sources.orValue([]).all(s, !has(s.secret)))",
			"variables.volumes.filter(v, has(v.projected) && v.projected.?sources.orValue([]).exists(s, has(s.secret))).map(v, 'volume ' + v.name + ' projects Secret ' + v.projected.sources.filter(s, has(s.secret)).map(s, s.secret.?name.orValue('')).join(', ')).join('; ') + ': the runner may not mount Secrets'",
			"a projected volume holds a Secret: the runner may not mount Secrets",
		},
		{
			"variables.volumes.all(v, !has(v.projected) || v.projected.?sources.orValue([]).all(s, !has(s.serviceAccountToken)))",
			"'volume ' + variables.volumes.filter(v, has(v.projected) && v.projected.?sources.orValue([]).exists(s, has(s.serviceAccountToken))).map(v, v.name).join(', ') + ' projects a service account token: run pods carry no token'",
			"a projected volume holds a service account token: run pods carry no token",
		},
		{
			"variables.volumes.all(v, !has(v.hostPath))",
			"variables.volumes.filter(v, has(v.hostPath)).map(v, 'volume ' + v.name + ' mounts host path ' + v.hostPath.?path.orValue('')).join(', ') + ': the runner may not mount host paths'",
			"a volume mounts a host path: the runner may not mount host paths",
		},
		{
			"variables.volumes.all(v, has(v.emptyDir))",
			"variables.volumes.filter(v, !has(v.emptyDir)).map(v, 'volume ' + v.name + ' is ' + v.filter(k, k != 'name').join(', ')).join('; ') + ': the runner mounts emptyDir volumes only'",
			"a volume is not an emptyDir: the runner mounts emptyDir volumes only",
		},
		{
			"variables.containers.all(c, c.?env.orValue([]).all(e, !has(e.valueFrom) || !has(e.valueFrom.secretKeyRef)))",
			"variables.containers.map(c, c.?env.orValue([]).filter(e, has(e.valueFrom) && has(e.valueFrom.secretKeyRef)).map(e, 'env ' + e.name + ' of container ' + c.name + ' reads Secret ' + e.valueFrom.secretKeyRef.?name.orValue('')).join(', ')).filter(s, s != '').join('; ') + ': the runner may not read Secrets'",
			"an env variable reads a Secret (secretKeyRef): the runner may not read Secrets",
		},
		{
			"variables.containers.all(c, c.?envFrom.orValue([]).all(e, !has(e.secretRef)))",
			"variables.containers.map(c, c.?envFrom.orValue([]).filter(e, has(e.secretRef)).map(e, 'envFrom of container ' + c.name + ' reads Secret ' + e.secretRef.?name.orValue('')).join(', ')).filter(s, s != '').join('; ') + ': the runner may not read Secrets'",
			"envFrom reads a Secret (secretRef): the runner may not read Secrets",
		},
		{
			"variables.containers.all(c, c.?env.orValue([]).all(e, !has(e.valueFrom)) && c.?envFrom.orValue([]).size() == 0)",
			"variables.containers.filter(c, c.?env.orValue([]).exists(e, has(e.valueFrom)) || c.?envFrom.orValue([]).size() > 0).map(c, 'container ' + c.name + ' takes env from other objects (valueFrom or envFrom)').join('; ') + ': the runner sets plain env values only'",
			"a container takes env from other objects (valueFrom or envFrom): the runner sets plain env values only",
		},
		{
			"!variables.spec.?hostNetwork.orValue(false) && !variables.spec.?hostPID.orValue(false) && !variables.spec.?hostIPC.orValue(false)",
			"['hostNetwork', 'hostPID', 'hostIPC'].filter(k, variables.spec[?k].orValue(false) == true).join(', ') + ' set: the runner shares no host namespace'",
			"a host namespace is shared (hostNetwork, hostPID or hostIPC): the runner shares none",
		},
		{
			"variables.containers.all(c, c.?ports.orValue([]).all(p, p.?hostPort.orValue(0) == 0))",
			"variables.containers.filter(c, c.?ports.orValue([]).exists(p, p.?hostPort.orValue(0) != 0)).map(c, 'container ' + c.name + ' binds host port ' + c.ports.filter(p, p.?hostPort.orValue(0) != 0).map(p, string(p.hostPort)).join(', ')).join('; ') + ': the runner binds no host port'",
			"a container binds a host port: the runner binds none",
		},
		{
			"variables.spec.?automountServiceAccountToken.orValue(true) == false",
			"'automountServiceAccountToken is ' + (variables.spec.?automountServiceAccountToken.hasValue() ? (variables.spec.automountServiceAccountToken ? 'true' : 'false') : 'not set') + ': run pods must set it to false'",
			"automountServiceAccountToken is not false: run pods must set it to false",
		},
		{
			"variables.containers.all(c, c.?securityContext.?privileged.orValue(false) == false)",
			"'container ' + variables.containers.filter(c, c.?securityContext.?privileged.orValue(false) == true).map(c, c.name).join(', ') + ' is privileged: the runner never is'",
			"a container is privileged: the runner never is",
		},
		{
			"variables.containers.all(c, c.?securityContext.?allowPrivilegeEscalation.orValue(true) == false)",
			"'container ' + variables.containers.filter(c, c.?securityContext.?allowPrivilegeEscalation.orValue(true) != false).map(c, c.name).join(', ') + ' does not set allowPrivilegeEscalation to false: the runner always does'",
			"a container does not set allowPrivilegeEscalation to false: the runner always does",
		},
		{
			"variables.containers.all(c, 'ALL' in c.?securityContext.?capabilities.?drop.orValue([]))",
			"'container ' + variables.containers.filter(c, !('ALL' in c.?securityContext.?capabilities.?drop.orValue([]))).map(c, c.name).join(', ') + ' does not drop ALL capabilities: the runner always does'",
			"a container does not drop ALL capabilities: the runner always does",
		},
		{
			"variables.containers.all(c, c.?securityContext.?capabilities.?add.orValue([]).all(a, variables.allowRoot && a in variables.rootCapabilities))",
			"variables.containers.filter(c, !c.?securityContext.?capabilities.?add.orValue([]).all(a, variables.allowRoot && a in variables.rootCapabilities)).map(c, 'container ' + c.name + ' adds capability ' + c.securityContext.capabilities.add.filter(a, !(variables.allowRoot && a in variables.rootCapabilities)).join(', ')).join('; ') + (variables.allowRoot ? ': the runner adds only ' + variables.rootCapabilities.join(', ') : ': the runner adds none (steps run as root only with --allow-root-steps)')",
			"a container adds a capability the runner does not",
		},
		{
			"variables.allowRoot || variables.containers.all(c, c.?securityContext.?runAsNonRoot.orValue(variables.podRunAsNonRoot) == true)",
			"'container ' + variables.containers.filter(c, c.?securityContext.?runAsNonRoot.orValue(variables.podRunAsNonRoot) != true).map(c, c.name).join(', ') + ' does not set runAsNonRoot: the runner runs steps as a non-root user (root only with --allow-root-steps)'",
			"a container does not set runAsNonRoot: the runner runs steps as a non-root user (root only with --allow-root-steps)",
		},
		{
			"variables.allowRoot || (variables.podRunAsUser != 0 && variables.containers.all(c, c.?securityContext.?runAsUser.orValue(-1) != 0))",
			"'runAsUser 0 (root) is set: the runner runs steps as a non-root user (root only with --allow-root-steps)'",
			"runAsUser 0 (root) is set: the runner runs steps as a non-root user (root only with --allow-root-steps)",
		},
		{
			"variables.containers.all(c, c.?securityContext.?seccompProfile.?type.orValue(variables.podSeccomp) == 'RuntimeDefault')",
			"'container ' + variables.containers.filter(c, c.?securityContext.?seccompProfile.?type.orValue(variables.podSeccomp) != 'RuntimeDefault').map(c, c.name).join(', ') + ' has no seccomp profile RuntimeDefault: the runner always sets it'",
			"a container has no seccomp profile RuntimeDefault: the runner always sets it",
		},
		{
			"variables.spec.?imagePullSecrets.orValue([]).all(s, s.?name.orValue('') in variables.pullSecrets)",
			"'imagePullSecrets names ' + variables.spec.imagePullSecrets.filter(s, !(s.?name.orValue('') in variables.pullSecrets)).map(s, s.?name.orValue('')).join(', ') + (variables.pullSecrets.size() == 0 ? ': the operator allowed no pull Secret' : ': the operator allowed only ' + variables.pullSecrets.join(', '))",
			"imagePullSecrets names a Secret the operator did not allow",
		},
	}
	forbidden := metav1.StatusReasonForbidden
	out := make([]admissionregistrationv1.Validation, len(checks))
	for i, c := range checks {
		out[i] = admissionregistrationv1.Validation{Expression: c.expr, MessageExpression: c.messageExpr, Message: c.message, Reason: &forbidden}
	}
	return out
}

// RequireAdmissionPolicy asks the API server's discovery whether it
// serves ValidatingAdmissionPolicy and its binding in
// admissionregistration.k8s.io/v1; when not, the error wraps
// ErrNoAdmissionPolicy.
func RequireAdmissionPolicy(ctx context.Context, cs *kubeclient.Clientset) error {
	// client-go's discovery client, which asked before, bounds its
	// requests so: an API server that does not answer ends the command.
	ctx, cancel := context.WithTimeout(ctx, 32*time.Second)
	defer cancel()
	list, err := kubeclient.ServerResourcesForGroupVersion(ctx, cs.AdmissionregistrationV1().RESTClient(), AdmissionGroupVersion)
	return admissionPolicyServed(list, err)
}

// admissionPolicyServed judges a discovery answer for
// admissionregistration.k8s.io/v1.
func admissionPolicyServed(list *metav1.APIResourceList, err error) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s is not served", ErrNoAdmissionPolicy, AdmissionGroupVersion)
	}
	if err != nil {
		return fmt.Errorf("discover %s: %w", AdmissionGroupVersion, err)
	}
	var missing []string
	for _, want := range []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"} {
		found := false
		for _, r := range list.APIResources {
			found = found || r.Name == want
		}
		if !found {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s has no %s", ErrNoAdmissionPolicy, AdmissionGroupVersion, strings.Join(missing, " or "))
	}
	return nil
}

// fieldManager owns the policy's fields in server-side apply.
const fieldManager = "knotless-run"

// EnsureAdmissionPolicy creates or updates the policy and its binding by
// server-side apply: idempotent, safe to run concurrently, and a second
// run with other options (another pull secret) updates them.
func EnsureAdmissionPolicy(ctx context.Context, cs *kubeclient.Clientset, p Policy) error {
	policy, binding, err := AdmissionPolicy(p)
	if err != nil {
		return err
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force}
	body, err := applyBody(policy)
	if err != nil {
		return err
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Patch(ctx, policy.Name, types.ApplyPatchType, body, opts); err != nil {
		return clusterPermission(err, "validatingadmissionpolicies", policy.Name)
	}
	if body, err = applyBody(binding); err != nil {
		return err
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Patch(ctx, binding.Name, types.ApplyPatchType, body, opts); err != nil {
		return clusterPermission(err, "validatingadmissionpolicybindings", binding.Name)
	}
	return nil
}

// applyBody is obj as a server-side apply body: its JSON without the
// empty creationTimestamp and status of a typed object.
func applyBody(obj any) ([]byte, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	delete(m, "status")
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	return json.Marshal(m)
}

// clusterPermission names the missing right on a cluster-wide resource.
func clusterPermission(err error, resource, name string) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("the admin credential may not apply %s %s (cluster-wide; RBAC: create and patch): %w", resource, name, err)
	}
	return fmt.Errorf("apply %s %s: %w", resource, name, err)
}

// probeName names the Job VerifyAdmission offers, in a dry run only.
const probeName = "knotless-admission-probe"

// AdmissionProbe is a Job shaped as the runner's own but for one volume
// that mounts a Secret: what the policy exists to refuse.
func AdmissionProbe(namespace string) *batchv1.Job {
	no, yes := false, true
	user := int64(1000)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: probeName, Namespace: namespace, Labels: Labels()},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: &yes, RunAsUser: &user,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Volumes: []corev1.Volume{{Name: "probe", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: probeName}}}},
			Containers: []corev1.Container{{
				Name: "probe", Image: probeName, Command: []string{"true"},
				VolumeMounts: []corev1.VolumeMount{{Name: "probe", MountPath: "/probe"}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		}}},
	}
}

// RefusedByPolicy reports whether err is the admission policy's refusal.
func RefusedByPolicy(err error, policy string) bool {
	return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}

// VerifyAdmission asks the API server, as the credential cfg, to create
// in a dry run a Job that mounts a Secret, and wants the policy's
// refusal. The API server learns of a new policy from a watch, so a
// dry run admitted is asked again, for up to settle.
func VerifyAdmission(ctx context.Context, cfg *rest.Config, namespace, policy string, settle time.Duration) error {
	cs, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(settle)
	wait := 100 * time.Millisecond
	for {
		_, err := cs.BatchV1().Jobs(namespace).Create(ctx, AdmissionProbe(namespace), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case RefusedByPolicy(err, policy):
			return nil
		case err != nil:
			return fmt.Errorf("dry run of a Job mounting a Secret, as the new credential: %w", err)
		case time.Now().Add(wait).After(deadline):
			return fmt.Errorf("the admission policy %s does not refuse, for the new credential, a Job mounting a Secret (a dry run was admitted for %s)", policy, settle)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}
