// Package manifests builds what an operator applies to run knotless-run
// inside the cluster it runs Jobs on: the runs namespace, the runner's
// ServiceAccount, its Role and RoleBinding (kubecred's rules, the same
// rights `knotless-run kubeconfig` grants), the admission policy that
// `kubeconfig` installs, and the runner's StatefulSet: one replica, or
// several (serve --replicas) with a PodDisruptionBudget, spread across
// nodes.
package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/kubecred"
)

// Options say what to build.
type Options struct {
	Namespace         string // the runner's own namespace (exists; holds the Secret)
	RunsNamespace     string // where run Jobs go
	Name              string // of the ServiceAccount, Role, RoleBinding and StatefulSet
	Image             string // the runner's image
	StorageClass      string // of the state and cache volume; "" for the cluster's default
	StorageSize       string // of the state and cache volume
	DID               string
	PDS               string
	AppPasswordSecret string // Secret in Namespace with key AppPasswordKey
	Repos             []string
	// ServeFlags are more flags for serve (e.g. --plc-url URL), each
	// element one argument, placed before the repositories.
	ServeFlags []string
	// AllowImagePullSecrets are the Secret names the admission policy
	// lets run pods give in imagePullSecrets; SkipAdmissionPolicy leaves
	// the policy out (admission.go).
	AllowImagePullSecrets []string
	SkipAdmissionPolicy   bool
	// EgressUntrusted is serve's --egress-untrusted, what pulls' run
	// pods may send out; "" is public.
	EgressUntrusted string
	// Replicas is how many pods run the runner (0 is 1). More than one
	// run serve --replicas, each named after its pod, and need
	// SealingKeySecret.
	Replicas int
	// SealingKeySecret is a Secret in Namespace holding the runner's
	// sealing key pair (a state directory's secrets-key.json) under the
	// key SealingKeyKey, mounted as every pod's own; "": each pod's
	// state volume keeps the key it made.
	SealingKeySecret string
}

// Paths and numbers inside the runner's pod.
const (
	AppPasswordKey = "app-password"
	// SealingKeyKey is the key of the sealing key in SealingKeySecret:
	// the file's name in a state directory (state.KeyFile).
	SealingKeyKey = "secrets-key.json"
	secretDir     = "/run/secrets/knotless"
	stateDir      = "/var/lib/knotless"
	cacheDir      = "/var/cache/knotless"
	readyFile     = "/tmp/knotless-ready"
	uid           = 65532
	// On SIGTERM the Kubernetes executor detaches started runs at once
	// (their Jobs go on; the successor adopts them from state.json): the
	// grace period covers that handover, never the runs themselves.
	gracePeriod     = 60 // seconds
	dataVolume      = "data"
	tmpVolume       = "tmp"
	secretVolume    = "app-password"
	keyVolume       = "sealing-key"
	appLabel        = "app.kubernetes.io/name"
	appLabelValue   = "knotless-run"
	instanceLabel   = "app.kubernetes.io/instance"
	defaultName     = "knotless-runner"
	defaultSize     = "10Gi"
	podSecurityRule = "restricted"
)

// Objects returns the objects in the order they are applied.
func Objects(o Options) ([]runtime.Object, error) {
	o, size, err := complete(o)
	if err != nil {
		return nil, err
	}
	labels := kubecred.Labels()
	labels[appLabel] = appLabelValue
	labels[instanceLabel] = o.Name
	meta := func(kind, apiVersion, ns string) (metav1.TypeMeta, metav1.ObjectMeta) {
		return metav1.TypeMeta{Kind: kind, APIVersion: apiVersion}, metav1.ObjectMeta{Name: o.Name, Namespace: ns, Labels: clone(labels)}
	}

	ns := &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{Kind: "Namespace", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: o.RunsNamespace, Labels: kubecred.NamespaceLabels(podSecurityRule)},
	}
	sa := &corev1.ServiceAccount{}
	sa.TypeMeta, sa.ObjectMeta = meta("ServiceAccount", "v1", o.Namespace)
	role := &rbacv1.Role{Rules: kubecred.Rules()}
	role.TypeMeta, role.ObjectMeta = meta("Role", "rbac.authorization.k8s.io/v1", o.RunsNamespace)
	binding := &rbacv1.RoleBinding{
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: o.Name, Namespace: o.Namespace}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: o.Name},
	}
	binding.TypeMeta, binding.ObjectMeta = meta("RoleBinding", "rbac.authorization.k8s.io/v1", o.RunsNamespace)
	sts := statefulSet(o, size, labels)
	sts.TypeMeta, sts.ObjectMeta = meta("StatefulSet", "apps/v1", o.Namespace)
	runner := []runtime.Object{sts}
	if o.Replicas > 1 {
		// A drain or an upgrade takes one replica at a time: the others
		// take its share of the events and its runs.
		pdb := &policyv1.PodDisruptionBudget{Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr(intstr.FromInt32(1)),
			Selector:       sts.Spec.Selector,
		}}
		pdb.TypeMeta, pdb.ObjectMeta = meta("PodDisruptionBudget", "policy/v1", o.Namespace)
		runner = append(runner, pdb)
	}
	// The admission policy before the runner that it holds.
	policy, err := admissionObjects(o)
	if err != nil {
		return nil, err
	}
	return slices.Concat([]runtime.Object{ns, sa, role, binding}, policy, runner), nil
}

// complete fills in o's defaults and checks it: the storage size (also
// returned, parsed), the serve flags, the egress of untrusted runs and
// the options every runner needs.
func complete(o Options) (Options, resource.Quantity, error) {
	if o.Name == "" {
		o.Name = defaultName
	}
	if o.StorageSize == "" {
		o.StorageSize = defaultSize
	}
	size, err := resource.ParseQuantity(o.StorageSize)
	if err != nil {
		return o, size, fmt.Errorf("storage size %q: %w", o.StorageSize, err)
	}
	if err := checkServeFlags(o.ServeFlags); err != nil {
		return o, size, err
	}
	if o.EgressUntrusted == "" {
		o.EgressUntrusted = string(kubernetes.EgressPublic)
	}
	if _, err := kubernetes.ParseEgressMode(o.EgressUntrusted); err != nil {
		return o, size, fmt.Errorf("--egress-untrusted: %w", err)
	}
	if o.Replicas < 0 {
		return o, size, fmt.Errorf("--replicas %d: want 1 or more", o.Replicas)
	}
	if o.Replicas > 1 {
		// Every replica must open what repositories sealed to the one key.
		if o.SealingKeySecret == "" {
			return o, size, fmt.Errorf("--replicas %d needs --sealing-key-secret: every replica must hold the same sealing key", o.Replicas)
		}
		// serve refuses these with --replicas (exit 78): say so now.
		for _, f := range o.ServeFlags {
			name, _, _ := strings.Cut(f, "=")
			if name == "--queue" || name == "--warm-pods" {
				return o, size, fmt.Errorf("--serve-flag %s with --replicas %d: serve refuses %s with replicas", name, o.Replicas, name)
			}
		}
	}
	for _, req := range [][2]string{{"namespace", o.Namespace}, {"runs namespace", o.RunsNamespace}, {"image", o.Image}, {"app password secret", o.AppPasswordSecret}, {"did", o.DID}} {
		if req[1] == "" {
			return o, size, fmt.Errorf("the %s is required", req[0])
		}
	}
	return o, size, nil
}

// serveArgs are the runner container's arguments: knotless-run serve
// on the Kubernetes executor in the runs namespace, with the state,
// cache and secret paths the pod mounts, then the operator's flags and
// repositories.
func serveArgs(o Options) []string {
	// No --kubeconfig and no KUBECONFIG: the executor loads the pod's
	// projected service-account token, re-read as the kubelet rotates it.
	args := []string{"serve", "--executor", "kubernetes", "--namespace", o.RunsNamespace,
		"--did", o.DID}
	if o.PDS != "" {
		args = append(args, "--pds", o.PDS)
	}
	args = append(args,
		"--app-password-file", secretDir+"/"+AppPasswordKey,
		"--state-dir", stateDir, "--cache-dir", cacheDir,
		"--ready-file", readyFile,
		// Pulls' pods reach DNS and the public internet only: not the
		// API server, the nodes, the cluster's Services or the metadata
		// addresses.
		"--egress-untrusted", o.EgressUntrusted)
	if o.Replicas > 1 {
		// Each replica's name is its host's: the pod's, stable across
		// its restarts.
		args = append(args, "--replicas")
	}
	args = append(args, o.ServeFlags...)
	args = append(args, o.Repos...)
	return args
}

// statefulSet is the runner: o.Replicas pods of serveArgs (several
// spread across nodes), locked down, each with a volume claim of size
// for its state and caches, the app password mounted from its Secret,
// and the sealing key from its Secret when there is one. Its own type
// and object metadata are the caller's.
func statefulSet(o Options, size resource.Quantity, labels map[string]string) *appsv1.StatefulSet {
	selector := map[string]string{appLabel: appLabelValue, instanceLabel: o.Name}
	args := serveArgs(o)
	pvc := corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: dataVolume, Labels: clone(labels)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if o.StorageClass != "" {
		pvc.Spec.StorageClassName = ptr(o.StorageClass)
	}
	mounts := []corev1.VolumeMount{
		{Name: dataVolume, MountPath: stateDir, SubPath: "state"},
		{Name: dataVolume, MountPath: cacheDir, SubPath: "cache"},
		{Name: secretVolume, MountPath: secretDir, ReadOnly: true},
		{Name: tmpVolume, MountPath: "/tmp"},
	}
	volumes := []corev1.Volume{
		{Name: secretVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  o.AppPasswordSecret,
			Items:       []corev1.KeyToPath{{Key: AppPasswordKey, Path: AppPasswordKey}},
			DefaultMode: ptr(int32(0o440)),
		}}},
		{Name: tmpVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	if o.SealingKeySecret != "" {
		// The file serve reads in its state directory (it makes one only
		// where there is none), over the pod's own volume.
		mounts = append(mounts, corev1.VolumeMount{Name: keyVolume, MountPath: stateDir + "/" + SealingKeyKey, SubPath: SealingKeyKey, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: keyVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  o.SealingKeySecret,
			Items:       []corev1.KeyToPath{{Key: SealingKeyKey, Path: SealingKeyKey}},
			DefaultMode: ptr(int32(0o440)),
		}}})
	}
	var spread []corev1.TopologySpreadConstraint
	if o.Replicas > 1 {
		// Preferred, not required: a cluster of fewer nodes than
		// replicas still runs them all.
		spread = []corev1.TopologySpreadConstraint{{
			MaxSkew:           1,
			TopologyKey:       corev1.LabelHostname,
			WhenUnsatisfiable: corev1.ScheduleAnyway,
			LabelSelector:     &metav1.LabelSelector{MatchLabels: selector},
		}}
	}
	sts := &appsv1.StatefulSet{
		Spec: appsv1.StatefulSetSpec{
			Replicas:             ptr(int32(max(o.Replicas, 1))),
			ServiceName:          o.Name,
			Selector:             &metav1.LabelSelector{MatchLabels: selector},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{pvc},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: clone(labels)},
				Spec: corev1.PodSpec{
					ServiceAccountName:            o.Name,
					AutomountServiceAccountToken:  ptr(true),
					TerminationGracePeriodSeconds: ptr(int64(gracePeriod)),
					TopologySpreadConstraints:     spread,
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr(true),
						RunAsUser:      ptr(int64(uid)),
						RunAsGroup:     ptr(int64(uid)),
						FSGroup:        ptr(int64(uid)),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:  "runner",
						Image: o.Image,
						Args:  args,
						Env:   []corev1.EnvVar{{Name: "HOME", Value: "/tmp"}},
						// Ready from READY=1 (state loaded, logged in,
						// adopted runs resumed) until SIGTERM, and not
						// while the executor is degraded.
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"knotless-run", "ready", "--ready-file", readyFile}}},
							PeriodSeconds:    5,
							TimeoutSeconds:   5,
							FailureThreshold: 2,
						},
						VolumeMounts: mounts,
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot:             ptr(true),
							AllowPrivilegeEscalation: ptr(false),
							ReadOnlyRootFilesystem:   ptr(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						},
					}},
					Volumes: volumes,
				},
			},
		},
	}
	return sts
}

// ownFlags are the serve flags the manifests set themselves, and
// --kubeconfig (the runner uses its pod's service account) and
// --replica-name (a replica's name is its pod's).
var ownFlags = []string{"--executor", "--namespace", "--did", "--pds", "--app-password-file",
	"--state-dir", "--cache-dir", "--ready-file", "--kubeconfig", "--context", "--config", "--egress-untrusted",
	"--replicas", "--replica-name"}

// checkServeFlags refuses a flag the manifests set, and an argument list
// that does not start with a flag.
func checkServeFlags(flags []string) error {
	if len(flags) > 0 && !strings.HasPrefix(flags[0], "--") {
		return fmt.Errorf("--serve-flag %q: the first must be a flag (--name or --name=value)", flags[0])
	}
	for _, f := range flags {
		name, _, _ := strings.Cut(f, "=")
		if slices.Contains(ownFlags, name) {
			return fmt.Errorf("--serve-flag %s: set by the manifests themselves (%s)", name, strings.Join(ownFlags, ", "))
		}
	}
	return nil
}

// YAML renders objects as one multi-document YAML stream, without the
// empty status and creationTimestamp fields of typed objects.
func YAML(objects []runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	for _, obj := range objects {
		b, err := json.Marshal(obj)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		delete(m, "status") // what the cluster reports, not what is applied
		prune(m)
		y, err := yaml.Marshal(m)
		if err != nil {
			return nil, err
		}
		buf.WriteString("---\n")
		buf.Write(y)
	}
	return buf.Bytes(), nil
}

// prune drops null values and empty status objects, at every depth.
func prune(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(map[string]any); x == nil || ok && k == "status" && len(s) == 0 {
				delete(v, k)
				continue
			}
			prune(x)
		}
	case []any:
		for _, x := range v {
			prune(x)
		}
	}
}

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func ptr[T any](v T) *T { return &v }
