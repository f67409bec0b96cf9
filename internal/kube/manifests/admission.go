package manifests

import (
	"k8s.io/apimachinery/pkg/runtime"

	"knotless.dev/run/internal/kube/kubecred"
)

// admissionObjects are the runner's admission policy and its binding,
// as `knotless-run kubeconfig` installs them (kubecred.AdmissionPolicy),
// for the in-cluster runner's ServiceAccount: its Jobs get the shape the
// executor builds, under the runs namespace's Pod Security restricted
// (no root steps), with the pull Secrets the operator allowed. None with
// SkipAdmissionPolicy.
func admissionObjects(o Options) ([]runtime.Object, error) {
	if o.SkipAdmissionPolicy {
		return nil, nil
	}
	policy, binding, err := kubecred.AdmissionPolicy(kubecred.Policy{
		Namespace:        o.Namespace,
		ServiceAccount:   o.Name,
		AllowRoot:        podSecurityRule == "baseline",
		ImagePullSecrets: o.AllowImagePullSecrets,
	})
	if err != nil {
		return nil, err
	}
	return []runtime.Object{policy, binding}, nil
}
