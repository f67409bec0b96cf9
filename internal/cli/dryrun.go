package cli

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/mask"
)

// dryRunNamespace is the namespace a dry run shows when --namespace is
// not set: the kubeconfig, which may name another, is not read.
const dryRunNamespace = "knotless-runs"

// printManifests prints, as YAML, the NetworkPolicy and Job the
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
	egress, err := f.egress()
	if err != nil {
		return err
	}
	// With --egress allow-dns the executor also blocks the API server's
	// addresses, which come from the kubeconfig a dry run does not read.
	policy := kubernetes.BuildNetworkPolicy(ns, spec.Runner, egress)
	policy.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
	values := make([]string, 0, len(secrets))
	for _, v := range secrets {
		values = append(values, v)
	}
	fmt.Fprintf(env.Stdout, "# --dry-run: nothing is applied; namespace %s (--namespace, else %s: the kubeconfig is not read)\n", ns, dryRunNamespace)
	for _, obj := range []any{policy, job} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return fmt.Errorf("--dry-run: %w", err)
		}
		fmt.Fprintf(env.Stdout, "---\n%s", mask.String(string(b), values))
	}
	fmt.Fprintln(env.Stdout, "---")
	return nil
}
