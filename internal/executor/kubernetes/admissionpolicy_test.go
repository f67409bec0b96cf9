package kubernetes_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	knotlesskube "knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubeclient"
	"knotless.dev/run/internal/kube/kubecred"
	"knotless.dev/run/tests/clustertest"
)

// withPolicy mints the runner's credential in the test's namespace as
// `knotless-run kubeconfig` does, the admission policy included, and
// waits until the API server holds the runner to it. It returns the
// kubeconfig file, a client with the runner's credential, and the
// policy's name.
func withPolicy(t *testing.T, c *clustertest.Cluster, o kubecred.Options) (string, *kubernetes.Clientset, string) {
	t.Helper()
	ctx := t.Context()
	admin := adminClient(t, c)
	if err := kubecred.Ensure(ctx, admin, o); err != nil {
		t.Fatal(err)
	}
	if err := kubecred.EnsureAdmissionPolicy(ctx, admin, kubecred.PolicyOf(o)); err != nil {
		t.Fatal(err)
	}
	kc, _, err := kubecred.Mint(ctx, admin, c.Config, o)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "runner.kubeconfig")
	if err := kubecred.WriteKubeconfig(path, kc); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubecred.VerifySettled(ctx, cfg, o.Namespace, time.Minute); err != nil {
		t.Fatal(err)
	}
	name := kubecred.PolicyName(o.Namespace, o.ServiceAccount)
	if err := kubecred.VerifyAdmission(ctx, cfg, o.Namespace, name, time.Minute); err != nil {
		t.Fatal(err)
	}
	runner, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return path, runner, name
}

// adminClient is the runner's own client (internal/kube/kubeclient) with the
// cluster's admin credential, for what `knotless-run kubeconfig` does.
func adminClient(t *testing.T, c *clustertest.Cluster) *kubeclient.Clientset {
	t.Helper()
	cs, err := kubeclient.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// runnerJob is a Job as BuildJob makes it for the runner's executor.
// pullSecrets gives each named Secret for the test image, to trusted
// and untrusted runs alike: the policy, not the pattern, is on trial.
func pullSecrets(c *clustertest.Cluster, names ...string) []knotlesskube.PullSecret {
	out := make([]knotlesskube.PullSecret, len(names))
	for i, n := range names {
		out[i] = knotlesskube.PullSecret{Name: n, Image: c.Image, Untrusted: true}
	}
	return out
}

func runnerJob(t *testing.T, c *clustertest.Cluster, spec executor.Spec, opts knotlesskube.PodOptions) *batchv1.Job {
	t.Helper()
	if spec.RunID == "" {
		spec.RunID = randomID("vap")
	}
	if spec.Runner == "" {
		spec.Runner = "did:plc:" + randomID("vap")
	}
	if spec.Image == "" {
		spec.Image = c.Image
	}
	job, err := knotlesskube.BuildJob(c.Namespace, spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

var dryRun = metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

// TestAdmissionPolicyRefusesStrangeJobs: with the runner's own scoped
// credential, a Job that reaches for the namespace's Secrets (a Secret
// volume, env or envFrom from a Secret, a projected Secret or token), for
// the node (hostPath, host namespaces or ports, privilege, capabilities,
// root) or for a pull Secret the operator did not name is refused, each
// with a message naming what it refused. An admin's same Job is admitted:
// the binding matches only the runner's service account. The runner may
// neither change nor delete the policy, and minting again updates it.
func TestAdmissionPolicyRefusesStrangeJobs(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	ctx := t.Context()
	o := kubecred.Options{Namespace: c.Namespace, ServiceAccount: "knotless-runner", Duration: time.Hour, ImagePullSecrets: []string{"ci-pull"}}
	kubeconfig, runner, name := withPolicy(t, c, o)

	secretVolume := func(s *corev1.PodSpec) {
		s.Volumes = append(s.Volumes, corev1.Volume{Name: "stolen", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "db-password"}}})
		s.Containers[0].VolumeMounts = append(s.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "stolen", MountPath: "/stolen"})
	}
	secretEnv := corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "db-password"}, Key: "pw"}}}
	projected := func(name string, src corev1.VolumeProjection) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{src}}}})
		}
	}
	sc := func(s *corev1.PodSpec) *corev1.SecurityContext { return s.Containers[0].SecurityContext }
	tests := []struct {
		name string
		mod  func(*corev1.PodSpec)
		want string
	}{
		{"a Secret volume", secretVolume, "volume stolen mounts Secret db-password: the runner may not mount Secrets"},
		{"env from a secretKeyRef", func(s *corev1.PodSpec) { s.Containers[0].Env = []corev1.EnvVar{secretEnv} },
			"env TOKEN of container run reads Secret db-password: the runner may not read Secrets"},
		{"envFrom a Secret", func(s *corev1.PodSpec) {
			s.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "db-password"}}}}
		}, "envFrom of container run reads Secret db-password: the runner may not read Secrets"},
		{"an init container with env from a Secret", func(s *corev1.PodSpec) {
			init := *s.Containers[0].DeepCopy()
			init.Name, init.Env = "init", []corev1.EnvVar{secretEnv}
			s.InitContainers = []corev1.Container{init}
		}, "env TOKEN of container init reads Secret db-password"},
		{"a projected Secret", projected("stolen", corev1.VolumeProjection{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "db-password"}}}),
			"volume stolen projects Secret db-password: the runner may not mount Secrets"},
		{"a projected service account token", projected("token", corev1.VolumeProjection{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}),
			"volume token projects a service account token"},
		{"a hostPath", func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}})
		}, "volume host mounts host path /etc: the runner may not mount host paths"},
		{"a ConfigMap volume", func(s *corev1.PodSpec) {
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}})
		}, "volume cfg is configMap: the runner mounts emptyDir volumes only"},
		{"env from a ConfigMap", func(s *corev1.PodSpec) {
			s.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}}}
		}, "container run takes env from other objects"},
		{"automountServiceAccountToken true", func(s *corev1.PodSpec) { s.AutomountServiceAccountToken = ptr.To(true) },
			"automountServiceAccountToken is true: run pods must set it to false"},
		{"automountServiceAccountToken unset", func(s *corev1.PodSpec) { s.AutomountServiceAccountToken = nil },
			"automountServiceAccountToken is not set"},
		{"hostNetwork", func(s *corev1.PodSpec) { s.HostNetwork = true }, "hostNetwork set: the runner shares no host namespace"},
		{"hostPID and hostIPC", func(s *corev1.PodSpec) { s.HostPID, s.HostIPC = true, true }, "hostPID, hostIPC set"},
		{"a host port", func(s *corev1.PodSpec) {
			s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080}}
		},
			"container run binds host port 8080"},
		// The API server refuses privileged with allowPrivilegeEscalation false.
		{"privileged", func(s *corev1.PodSpec) { sc(s).Privileged, sc(s).AllowPrivilegeEscalation = ptr.To(true), nil }, "container run is privileged"},
		{"privilege escalation", func(s *corev1.PodSpec) { sc(s).AllowPrivilegeEscalation = nil },
			"container run does not set allowPrivilegeEscalation to false"},
		{"capabilities kept", func(s *corev1.PodSpec) { sc(s).Capabilities.Drop = nil }, "container run does not drop ALL capabilities"},
		{"NET_RAW added", func(s *corev1.PodSpec) { sc(s).Capabilities.Add = []corev1.Capability{"NET_RAW"} },
			"container run adds capability NET_RAW: the runner adds none"},
		{"root", func(s *corev1.PodSpec) {
			s.SecurityContext.RunAsNonRoot, s.SecurityContext.RunAsUser = nil, nil
			sc(s).RunAsNonRoot, sc(s).RunAsUser = nil, nil
		}, "container run does not set runAsNonRoot"},
		{"no seccomp profile", func(s *corev1.PodSpec) { s.SecurityContext.SeccompProfile, sc(s).SeccompProfile = nil, nil },
			"container run has no seccomp profile RuntimeDefault"},
		{"a pull Secret not named", func(s *corev1.PodSpec) {
			s.ImagePullSecrets = append(s.ImagePullSecrets, corev1.LocalObjectReference{Name: "other-pull"})
		}, "imagePullSecrets names other-pull: the operator allowed only ci-pull"},
	}
	for _, tt := range tests {
		job := runnerJob(t, c, executor.Spec{}, knotlesskube.PodOptions{ImagePullSecrets: pullSecrets(c, "ci-pull")})
		tt.mod(&job.Spec.Template.Spec)
		_, err := runner.BatchV1().Jobs(c.Namespace).Create(ctx, job, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !kubecred.RefusedByPolicy(err, name) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s, as the runner: %v; want the policy's refusal saying %q", tt.name, err, tt.want)
		} else {
			t.Logf("%s: %v", tt.name, err)
		}
		if _, err := c.Clientset.BatchV1().Jobs(c.Namespace).Create(ctx, job, dryRun); err != nil {
			t.Errorf("%s, as an admin (dry run): %v; the policy holds the runner only", tt.name, err)
		}
	}

	// BuildJob with --allow-root-steps, under a policy minted without
	// --pod-security baseline.
	root := runnerJob(t, c, executor.Spec{}, knotlesskube.PodOptions{AllowRoot: true})
	if _, err := runner.BatchV1().Jobs(c.Namespace).Create(ctx, root, dryRun); !kubecred.RefusedByPolicy(err, name) || !strings.Contains(err.Error(), "adds capability CHOWN") {
		t.Errorf("a root Job under the restricted policy: %v; want it refused naming CHOWN", err)
	}

	// The runner itself, told of a pull Secret the policy was not: the
	// run ends error with the policy's words.
	ex := newExecutor(t, c, func(cfg *knotlesskube.Config) {
		cfg.Credentials.Kubeconfig = kubeconfig
		cfg.Pod.ImagePullSecrets = pullSecrets(c, "unlisted-pull")
	})
	res := engine(ex, c.Image).Run(ctx, run.Request{RunID: randomID("vap"), Workflow: parse(t, "on: push\nsteps: [{run: 'true'}]\n"), Checkout: t.TempDir(), Trusted: true})
	if res.Status != run.Error || !strings.Contains(res.Error, "imagePullSecrets names unlisted-pull: the operator allowed only ci-pull") {
		t.Errorf("a run whose pull Secret the policy does not allow: %s (%s), want error quoting the policy", res.Status, res.Error)
	}

	t.Run("pods too", func(t *testing.T) {
		// The Role creates no pods, and the Job controller makes them as
		// itself; were the runner granted pods, the policy holds them too.
		grant(t, c, o.ServiceAccount, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}})
		job := runnerJob(t, c, executor.Spec{}, knotlesskube.PodOptions{})
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stolen", Namespace: c.Namespace}, Spec: job.Spec.Template.Spec}
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := runner.CoreV1().Pods(c.Namespace).Create(ctx, pod, dryRun)
			return err == nil, nil // RBAC learns of the grant from a watch
		})
		if err != nil {
			t.Fatalf("the runner's own pod shape, as the runner granted pods: never admitted: %v", err)
		}
		secretVolume(&pod.Spec)
		_, err = runner.CoreV1().Pods(c.Namespace).Create(ctx, pod, dryRun)
		if !kubecred.RefusedByPolicy(err, name) || !strings.Contains(err.Error(), "volume stolen mounts Secret db-password") {
			t.Errorf("a pod with a Secret volume, as the runner: %v; want the policy's refusal", err)
		}
	})

	t.Run("the runner cannot change or remove it", func(t *testing.T) {
		policy, binding, err := kubecred.AdmissionPolicy(kubecred.PolicyOf(o))
		if err != nil {
			t.Fatal(err)
		}
		api := runner.AdmissionregistrationV1()
		open := []byte(`{"spec":{"validations":[{"expression":"true"}]}}`)
		for what, err := range map[string]error{
			"delete the policy":  api.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}),
			"delete the binding": api.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}),
			"update the policy":  second(api.ValidatingAdmissionPolicies().Update(ctx, policy, metav1.UpdateOptions{})),
			"update the binding": second(api.ValidatingAdmissionPolicyBindings().Update(ctx, binding, metav1.UpdateOptions{})),
			"patch the policy":   second(api.ValidatingAdmissionPolicies().Patch(ctx, name, types.MergePatchType, open, metav1.PatchOptions{})),
			"patch the binding": second(api.ValidatingAdmissionPolicyBindings().Patch(ctx, name, types.MergePatchType,
				[]byte(`{"spec":{"validationActions":["Audit"]}}`), metav1.PatchOptions{})),
		} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s with the runner's credential: %v, want Forbidden", what, err)
			}
		}
		if _, err := c.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("the binding after the runner's tries: %v", err)
		}
	})

	t.Run("minting again updates it", func(t *testing.T) {
		job := runnerJob(t, c, executor.Spec{}, knotlesskube.PodOptions{ImagePullSecrets: pullSecrets(c, "ci-pull", "mirror-pull")})
		if _, err := runner.BatchV1().Jobs(c.Namespace).Create(ctx, job, dryRun); !kubecred.RefusedByPolicy(err, name) {
			t.Fatalf("mirror-pull before it is allowed: %v, want refused", err)
		}
		o2 := o
		o2.ImagePullSecrets = []string{"ci-pull", "mirror-pull"}
		if err := kubecred.EnsureAdmissionPolicy(ctx, adminClient(t, c), kubecred.PolicyOf(o2)); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := runner.BatchV1().Jobs(c.Namespace).Create(ctx, job, dryRun)
			return err == nil, nil // the API server learns of the update from a watch
		})
		if err != nil {
			t.Errorf("mirror-pull after the policy allowed it: never admitted")
		}
		selector := metav1.ListOptions{LabelSelector: kubecred.LabelServiceAccountNamespace + "=" + c.Namespace}
		policies, err := c.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, selector)
		if err != nil {
			t.Fatal(err)
		}
		bindings, err := c.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, selector)
		if err != nil {
			t.Fatal(err)
		}
		if len(policies.Items) != 1 || len(bindings.Items) != 1 {
			t.Errorf("after two installs: %d policies and %d bindings, want one each", len(policies.Items), len(bindings.Items))
		}
	})

	t.Run("type-checked without warnings", func(t *testing.T) {
		var last string
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err := c.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if p.Status.ObservedGeneration != p.Generation || p.Status.TypeChecking == nil {
				return false, nil
			}
			for _, w := range p.Status.TypeChecking.ExpressionWarnings {
				last += w.FieldRef + ": " + w.Warning + "\n"
			}
			return true, nil
		})
		if err != nil || last != "" {
			t.Errorf("type checking: %v\n%s", err, last)
		}
	})
}

func second[T any](_ T, err error) error { return err }

// grant gives the service account one more rule in the test's namespace.
func grant(t *testing.T, c *clustertest.Cluster, sa string, rule rbacv1.PolicyRule) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "extra", Namespace: c.Namespace}, Rules: []rbacv1.PolicyRule{rule}}
	if _, err := c.Clientset.RbacV1().Roles(c.Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "extra", Namespace: c.Namespace},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: c.Namespace}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extra"},
	}
	if _, err := c.Clientset.RbacV1().RoleBindings(c.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestAdmissionPolicyAdmitsRunnerJobs: every Job BuildJob makes, in each
// configuration the runner supports, is admitted for the runner's
// credential under the policy, and the ones this cluster can run run; a
// whole run goes through the executor with that credential.
func TestAdmissionPolicyAdmitsRunnerJobs(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	o := kubecred.Options{Namespace: c.Namespace, ServiceAccount: "knotless-runner", Duration: time.Hour, ImagePullSecrets: []string{"ci-pull", "mirror-pull"}}
	kubeconfig, runner, _ := withPolicy(t, c, o)
	admitted(t, c, runner, []variant{
		{"defaults", executor.Spec{}, knotlesskube.PodOptions{}, true},
		{"requests, limits and a state size", executor.Spec{Resources: executor.Resources{CPU: "100m", Memory: "64Mi"}},
			knotlesskube.PodOptions{CPULimit: "1", MemoryLimit: "256Mi", StateSizeLimit: "64Mi"}, true},
		{"caches", executor.Spec{Caches: []string{"/cache/go", "/root/.cache"}}, knotlesskube.PodOptions{}, true},
		{"pull secrets", executor.Spec{}, knotlesskube.PodOptions{ImagePullSecrets: pullSecrets(c, "ci-pull", "mirror-pull")}, true},
		{"keep, a timeout and annotations", executor.Spec{Keep: true, Timeout: time.Minute, Annotations: map[string]string{"dev.knotless.check": "at://x"}}, knotlesskube.PodOptions{}, true},
		{"a run pod service account", executor.Spec{}, knotlesskube.PodOptions{ServiceAccount: "default"}, true},
		// This cluster has no such node or runtime: admission only.
		{"node selector and tolerations", executor.Spec{}, knotlesskube.PodOptions{
			NodeSelector: map[string]string{"pool": "ci"},
			Tolerations:  []corev1.Toleration{{Key: "ci", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		}, false},
		{"a runtime class", executor.Spec{}, knotlesskube.PodOptions{RuntimeClass: "gvisor"}, false},
	})
	ex := newExecutor(t, c, func(cfg *knotlesskube.Config) {
		cfg.Credentials.Kubeconfig = kubeconfig
		cfg.Pod.ImagePullSecrets = pullSecrets(c, "ci-pull")
	})
	res := engine(ex, c.Image).Run(t.Context(), run.Request{RunID: randomID("vap"), Workflow: parse(t, "on: push\nsteps: [{run: 'id -u'}]\n"), Checkout: t.TempDir(), Trusted: true})
	if res.Status != run.Success || !strings.Contains(string(res.Log), "1000") {
		t.Errorf("a run under the policy: %s (%s)\n%s", res.Status, res.Error, res.Log)
	}
}

// TestAdmissionPolicyAllowRoot: minted with --pod-security baseline, the
// policy admits the Job of a runner with --allow-root-steps, which runs
// its steps as root, and still refuses a capability beyond the six.
func TestAdmissionPolicyAllowRoot(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	o := kubecred.Options{Namespace: c.Namespace, ServiceAccount: "knotless-runner", Duration: time.Hour, PodSecurity: "baseline"}
	kubeconfig, runner, name := withPolicy(t, c, o)
	admitted(t, c, runner, []variant{
		{"root steps", executor.Spec{}, knotlesskube.PodOptions{AllowRoot: true}, true},
		{"root steps with caches", executor.Spec{Caches: []string{"/root/.cache"}}, knotlesskube.PodOptions{AllowRoot: true}, true},
		{"steps as 1000", executor.Spec{}, knotlesskube.PodOptions{}, true},
	})
	job := runnerJob(t, c, executor.Spec{}, knotlesskube.PodOptions{AllowRoot: true})
	sc := job.Spec.Template.Spec.Containers[0].SecurityContext
	sc.Capabilities.Add = append(sc.Capabilities.Add, "NET_RAW")
	_, err := runner.BatchV1().Jobs(c.Namespace).Create(t.Context(), job, dryRun)
	if !kubecred.RefusedByPolicy(err, name) || !strings.Contains(err.Error(), "adds capability NET_RAW: the runner adds only CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETUID, SETGID") {
		t.Errorf("a root Job adding NET_RAW: %v, want refused naming it", err)
	}
	sc.Capabilities.Add, sc.Privileged, sc.AllowPrivilegeEscalation = nil, ptr.To(true), nil
	if _, err := runner.BatchV1().Jobs(c.Namespace).Create(t.Context(), job, dryRun); !kubecred.RefusedByPolicy(err, name) {
		t.Errorf("a privileged root Job: %v, want refused", err)
	}
	ex := newExecutor(t, c, func(cfg *knotlesskube.Config) {
		cfg.Credentials.Kubeconfig = kubeconfig
		cfg.Pod.AllowRoot = true
	})
	res := engine(ex, c.Image).Run(t.Context(), run.Request{RunID: randomID("vap"), Workflow: parse(t, "on: push\nsteps: [{run: 'echo uid=$(id -u)'}]\n"), Checkout: t.TempDir(), Trusted: true})
	if res.Status != run.Success || !strings.Contains(string(res.Log), "uid=0") {
		t.Errorf("a root run under the policy: %s (%s)\n%s", res.Status, res.Error, res.Log)
	}
}

type variant struct {
	name string
	spec executor.Spec
	opts knotlesskube.PodOptions
	runs bool // whether this cluster can run it, not only admit it
}

// admitted creates each variant's Job with the runner's credential: a
// dry run for all, and for those this cluster can run, a Job whose pod
// must become Ready; then deletes it.
func admitted(t *testing.T, c *clustertest.Cluster, runner *kubernetes.Clientset, variants []variant) {
	t.Helper()
	ctx := t.Context()
	for _, v := range variants {
		job := runnerJob(t, c, v.spec, v.opts)
		if _, err := runner.BatchV1().Jobs(c.Namespace).Create(ctx, job, dryRun); err != nil {
			t.Errorf("%s: the runner's own Job is refused: %v", v.name, err)
			continue
		}
		if !v.runs {
			continue
		}
		if _, err := runner.BatchV1().Jobs(c.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Errorf("%s: create: %v", v.name, err)
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		_, err := c.WaitForPod(wctx, c.Namespace, "batch.kubernetes.io/job-name="+job.Name, clustertest.PodReady)
		cancel()
		if err != nil {
			t.Errorf("%s: the runner's own Job does not run: %v", v.name, err)
		}
		bg := metav1.DeletePropagationBackground
		if err := runner.BatchV1().Jobs(c.Namespace).Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
			t.Errorf("%s: delete: %v", v.name, err)
		}
	}
}
