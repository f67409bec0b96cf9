package kubernetes

import (
	"errors"
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// PullSecret is a Secret of the runs namespace (of type
// kubernetes.io/dockerconfigjson, made by the operator: the runner never
// creates one) that the kubelet may pull some run images with.
type PullSecret struct {
	Name string
	// Image is a glob, as path.Match reads it (* and ? stay within one
	// /-separated part, [...] is a class), that the whole image
	// reference must match, as the workflow (or the default image)
	// writes it: anchored at both ends.
	Image string
	// Untrusted gives the secret to untrusted runs (pulls, batches)
	// too. Without it a stranger's workflow never pulls with it.
	Untrusted bool
}

// pullSecretUntrusted is the marker after a pattern that gives the
// secret to untrusted runs too.
const pullSecretUntrusted = "untrusted"

// ParsePullSecret reads NAME=PATTERN[,untrusted].
func ParsePullSecret(s string) (PullSecret, error) {
	name, pattern, ok := strings.Cut(s, "=")
	if !ok || pattern == "" {
		return PullSecret{}, errors.New("no image pattern: write NAME=PATTERN (e.g. ci-pull=registry.example.com/team/*), adding ,untrusted to give the secret to pulls too")
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return PullSecret{}, fmt.Errorf("%q is not a Secret name: %s", name, strings.Join(msgs, "; "))
	}
	ps := PullSecret{Name: name, Image: pattern}
	if p, opt, ok := strings.Cut(pattern, ","); ok {
		if opt != pullSecretUntrusted {
			return PullSecret{}, fmt.Errorf("%q after the pattern: the only option is ,%s", opt, pullSecretUntrusted)
		}
		ps.Image, ps.Untrusted = p, true
	}
	if ps.Image == "" || strings.ContainsAny(ps.Image, " \t\n") {
		return PullSecret{}, fmt.Errorf("image pattern %q: want a glob of image references, without spaces", ps.Image)
	}
	if _, err := path.Match(ps.Image, ""); err != nil {
		return PullSecret{}, fmt.Errorf("image pattern %q: %w", ps.Image, err)
	}
	return ps, nil
}

// String is the secret as the flag writes it.
func (p PullSecret) String() string {
	if p.Untrusted {
		return p.Name + "=" + p.Image + "," + pullSecretUntrusted
	}
	return p.Name + "=" + p.Image
}

// matches reports whether the secret's pattern matches image.
func (p PullSecret) matches(image string) bool {
	ok, err := path.Match(p.Image, image)
	return err == nil && ok
}

// pullCredentials returns the names of the secrets a run's pod pulls
// image with (each once, in the order given) and its pull policy. A
// secret goes only to the images its pattern matches, and to an
// untrusted run only when marked so. An untrusted run whose image a
// secret withheld from it matches pulls Always: with IfNotPresent the
// kubelet would start the copy a trusted run pulled onto the node with
// that secret, without asking the registry; Always makes the registry
// judge the untrusted pod's own credentials.
func pullCredentials(secrets []PullSecret, image string, trusted bool) ([]string, corev1.PullPolicy) {
	var names []string
	policy := corev1.PullIfNotPresent
	seen := map[string]bool{}
	for _, s := range secrets {
		switch {
		case !s.matches(image):
		case trusted || s.Untrusted:
			if !seen[s.Name] {
				seen[s.Name] = true
				names = append(names, s.Name)
			}
		default:
			policy = corev1.PullAlways
		}
	}
	return names, policy
}
