package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"knotless.dev/run/internal/kube/kubeclient"
)

// EgressMode is what a run pod may send out.
type EgressMode string

// Egress modes. Open leaves egress as the cluster gives it; Deny allows
// none; AllowDNS allows DNS (UDP and TCP port 53) only, to pods of the
// cluster and to addresses outside the block list; Public allows that
// DNS and every other port to the public internet: no link-local,
// private, shared or loopback address (NonPublic), and nothing in the
// block list.
const (
	EgressOpen     EgressMode = "open"
	EgressDeny     EgressMode = "deny"
	EgressAllowDNS EgressMode = "allow-dns"
	EgressPublic   EgressMode = "public"
)

// ParseEgressMode reads an --egress or --egress-untrusted value; ""
// is the zero value, which Egress.For reads as that flag's default.
func ParseEgressMode(s string) (EgressMode, error) {
	switch m := EgressMode(s); m {
	case "", EgressOpen, EgressDeny, EgressAllowDNS, EgressPublic:
		return m, nil
	}
	return "", fmt.Errorf("egress mode %q: want public, deny, allow-dns or open", s)
}

// limitsEgress reports whether pods of mode m get an egress policy.
func (m EgressMode) limitsEgress() bool { return m != EgressOpen }

// blocks reports whether mode m's policy lists the block list.
func (m EgressMode) blocks() bool { return m == EgressAllowDNS || m == EgressPublic }

// Egress is the operator's egress setting for run pods. Trusted runs
// (pushes by the owner) get Mode, untrusted runs (pulls, batches)
// Untrusted: the run's trust is part of its input (executor.Spec).
type Egress struct {
	// Mode is trusted runs' mode; "" is open.
	Mode EgressMode
	// Untrusted is untrusted runs' mode; "" is public.
	Untrusted EgressMode
	// Block lists CIDRs that allow-dns's DNS and public's rules may not
	// reach: the API server, the runner's host, the metadata addresses.
	// See DefaultEgressBlock.
	Block []netip.Prefix
}

// For returns the mode of a run's pods.
func (e Egress) For(trusted bool) EgressMode {
	switch {
	case trusted && e.Mode == "":
		return EgressOpen
	case trusted:
		return e.Mode
	case e.Untrusted == "":
		return EgressPublic
	}
	return e.Untrusted
}

// LinkLocal holds the cloud metadata addresses (169.254.169.254 and
// friends) and is always blocked when egress is not open.
var LinkLocal = netip.MustParsePrefix("169.254.0.0/16")

// NonPublic returns the prefixes that public egress never reaches on
// any port: link-local (the metadata addresses), the private ranges
// (where a cluster's nodes, Services and the operator's own network
// live), shared address space (carrier-grade NAT, some clouds' nodes),
// loopback, IPv6 unique-local and link-local addresses and IPv6 loopback.
func NonPublic() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16",
		"::1/128", "fc00::/7", "fe80::/10",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// DefaultEgressBlock returns the prefixes to keep a run pod's DNS from:
// link-local (cloud metadata), the API server's addresses (host of
// apiServer, a URL or host[:port]; a name is resolved) and extra, the
// operator's own list (the runner's host, say).
func DefaultEgressBlock(ctx context.Context, apiServer string, extra []netip.Prefix) ([]netip.Prefix, error) {
	out := []netip.Prefix{LinkLocal}
	host := serverHost(apiServer)
	if host != "" {
		if a, err := netip.ParseAddr(host); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		} else {
			addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			if err != nil {
				return nil, fmt.Errorf("resolve the API server %s for the egress block list: %w", host, err)
			}
			for _, a := range addrs {
				out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			}
		}
	}
	return append(out, extra...), nil
}

// serverHost returns the host of a URL, host:port or host.
func serverHost(server string) string {
	if u, err := url.Parse(server); err == nil && u.Host != "" {
		return u.Hostname()
	}
	if h, _, err := net.SplitHostPort(server); err == nil {
		return h
	}
	return server
}

// BuildNetworkPolicy returns the policy that denies all ingress to this
// runner's run pods, whatever their egress: every pod with the runner's
// label. It limits no egress (a policy of an earlier version by this
// name that did is replaced by this one at the next run).
func BuildNetworkPolicy(namespace, runnerDID string) *networkingv1.NetworkPolicy {
	runner := RunnerLabel(runnerDID)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name:        networkPolicyNm + runner,
			Namespace:   namespace,
			Labels:      map[string]string{LabelRunner: runner, LabelManagedBy: managedByValue},
			Annotations: map[string]string{AnnotationDID: runnerDID},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelRunner: runner}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
}

// BuildEgressPolicy returns the policy that limits the egress of this
// runner's pods of one mode (labelled LabelEgress=mode), or nil for
// open, which limits nothing. block is the block list of allow-dns and
// public (DefaultEgressBlock); the other modes ignore it.
func BuildEgressPolicy(namespace, runnerDID string, mode EgressMode, block []netip.Prefix) *networkingv1.NetworkPolicy {
	if !mode.limitsEgress() {
		return nil
	}
	runner := RunnerLabel(runnerDID)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name:        egressPolicyNm + string(mode) + "-" + runner,
			Namespace:   namespace,
			Labels:      map[string]string{LabelRunner: runner, LabelEgress: string(mode), LabelManagedBy: managedByValue},
			Annotations: map[string]string{AnnotationDID: runnerDID},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelRunner: runner, LabelEgress: string(mode)}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		},
	}
	switch mode {
	case EgressAllowDNS:
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{dnsRule(block)}
	case EgressPublic:
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{dnsRule(block), publicRule(block)}
	}
	return np
}

// dnsRule allows port 53 over UDP and TCP to every pod of the cluster
// (the cluster DNS) and to every IPv4 address but the blocked ones (an
// upstream resolver). IPv6 gets no DNS: a cluster that resolves over it
// needs open egress or a policy of its own.
func dnsRule(block []netip.Prefix) networkingv1.NetworkPolicyEgressRule {
	var except []string
	seen := map[string]bool{}
	for _, p := range block {
		p = p.Masked()
		if !p.Addr().Is4() || p.Bits() == 0 || seen[p.String()] {
			continue
		}
		seen[p.String()] = true
		except = append(except, p.String())
	}
	slices.Sort(except)
	port := intstr.FromInt32(53)
	return networkingv1.NetworkPolicyEgressRule{
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: ptr.To(corev1.ProtocolUDP), Port: &port},
			{Protocol: ptr.To(corev1.ProtocolTCP), Port: &port},
		},
		To: []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: &metav1.LabelSelector{}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: except}},
		},
	}
}

// publicRule allows every port to every address but the non-public
// ones and the blocked ones, over IPv4 and IPv6.
func publicRule(block []netip.Prefix) networkingv1.NetworkPolicyEgressRule {
	not := append(NonPublic(), block...)
	return networkingv1.NetworkPolicyEgressRule{
		To: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: except(not, true)}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: except(not, false)}},
		},
	}
}

// except returns the prefixes of one family, masked, in address order,
// without those inside another: a stable list, so a policy read back
// compares equal to the one built.
func except(prefixes []netip.Prefix, v4 bool) []string {
	var ps []netip.Prefix
	for _, p := range prefixes {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		p = p.Masked()
		if p.Addr().Is4() == v4 && p.Bits() > 0 {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []string
	var last netip.Prefix
	for _, p := range ps {
		// Sorted by address, then shorter first: a prefix inside an
		// earlier one follows it.
		if last.IsValid() && last.Bits() <= p.Bits() && last.Contains(p.Addr()) {
			continue
		}
		last = p
		out = append(out, p.String())
	}
	return out
}

// ensureNetworkPolicy makes the runner's policy in ns be exactly want,
// before every run: a policy that was deleted is made again, and one
// with the right name but another spec (allow-all, say) is replaced.
// Runners start concurrently: a create that loses the race compares
// what won.
func ensureNetworkPolicy(ctx context.Context, cs *kubeclient.Clientset, want *networkingv1.NetworkPolicy) (string, error) {
	ns := want.Namespace
	nps := cs.NetworkingV1().NetworkPolicies(ns)
	for attempt := 0; ; attempt++ {
		have, err := nps.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = nps.Create(ctx, want, metav1.CreateOptions{})
			switch {
			case err == nil:
				return "created", nil
			case apierrors.IsAlreadyExists(err) && attempt < 3:
				continue
			case apierrors.IsForbidden(err):
				return "", fmt.Errorf("create network policy %s/%s: RBAC denies it (the runner's Role needs networkpolicies create): %w", ns, want.Name, err)
			}
			return "", fmt.Errorf("create network policy %s/%s: %w", ns, want.Name, err)
		case apierrors.IsForbidden(err):
			return "", fmt.Errorf("get network policy %s/%s: RBAC denies it (the runner's Role needs networkpolicies get): %w", ns, want.Name, err)
		case err != nil:
			return "", fmt.Errorf("get network policy %s/%s: %w", ns, want.Name, err)
		}
		if policyMatches(have, want) {
			return "", nil
		}
		upd := have.DeepCopy()
		upd.Spec = *want.Spec.DeepCopy()
		if upd.Labels == nil {
			upd.Labels = map[string]string{}
		}
		maps.Copy(upd.Labels, want.Labels)
		_, err = nps.Update(ctx, upd, metav1.UpdateOptions{})
		switch {
		case err == nil:
			return "replaced", nil
		case apierrors.IsConflict(err) && attempt < 3:
			continue
		case apierrors.IsForbidden(err):
			return "", fmt.Errorf("network policy %s/%s is not the runner's (another spec) and RBAC denies replacing it (the runner's Role needs networkpolicies update): %w", ns, want.Name, err)
		}
		return "", fmt.Errorf("replace network policy %s/%s whose spec differs: %w", ns, want.Name, err)
	}
}

// policyMatches compares the spec and the runner's labels: the API
// server's defaults (a port's protocol) are set in want already.
func policyMatches(have, want *networkingv1.NetworkPolicy) bool {
	for k, v := range want.Labels {
		if have.Labels[k] != v {
			return false
		}
	}
	return equality.Semantic.DeepEqual(normalize(have.Spec), normalize(want.Spec))
}

// normalize treats nil and empty lists alike.
func normalize(s networkingv1.NetworkPolicySpec) networkingv1.NetworkPolicySpec {
	s = *s.DeepCopy()
	if len(s.Ingress) == 0 {
		s.Ingress = nil
	}
	if len(s.Egress) == 0 {
		s.Egress = nil
	}
	return s
}
