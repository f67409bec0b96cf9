package cli

import (
	"fmt"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/lib/mask"
)

// dryRunNamespace is the namespace a dry run shows when --namespace is
// not set: the kubeconfig, which may name another, is not read.
const dryRunNamespace = "knotless-runs"

// printManifests prints, as YAML, the NetworkPolicies and the Job the
// Kubernetes executor would apply for spec. It reads no kubeconfig. The
// objects carry no secret value (steps get theirs on exec stdin); every
// value in secrets is masked all the same.
func (f *KubeFlags) printManifests(env *Env, image string, spec executor.Spec, secrets map[string]string) error {
	ns := f.Namespace
	if ns == "" {
		ns = dryRunNamespace
	}
	pod, err := f.podOptions(image)
	if err != nil {
		return err
	}
	job, err := kubernetes.BuildJob(ns, spec, pod)
	if err != nil {
		return fmt.Errorf("--dry-run: build job: %w", err)
	}
	job.TypeMeta = metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"}
	// The run's egress mode by its trust (--egress, --egress-untrusted).
	// With allow-dns or public the executor also blocks the API server's
	// addresses, which come from the kubeconfig a dry run does not read.
	mode := pod.Egress.For(spec.Trusted)
	policies := []*networkingv1.NetworkPolicy{kubernetes.BuildNetworkPolicy(ns, spec.Runner)}
	if np := kubernetes.BuildEgressPolicy(ns, spec.Runner, mode, append([]netip.Prefix{kubernetes.LinkLocal}, pod.Egress.Block...)); np != nil {
		policies = append(policies, np)
	}
	var objs []any
	for _, np := range policies {
		np.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
		objs = append(objs, np)
	}
	objs = append(objs, job)
	values := make([]string, 0, len(secrets))
	for _, v := range secrets {
		values = append(values, v)
	}
	fmt.Fprintf(env.Stdout, "# --dry-run: nothing is applied; namespace %s (--namespace, else %s: the kubeconfig is not read)\n", ns, dryRunNamespace)
	for _, obj := range objs {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return fmt.Errorf("--dry-run: %w", err)
		}
		fmt.Fprintf(env.Stdout, "---\n%s", mask.String(string(b), values))
	}
	fmt.Fprintln(env.Stdout, "---")
	return nil
}
