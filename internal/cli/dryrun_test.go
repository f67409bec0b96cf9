package cli

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDryRunKubernetesNeedsNoCluster: --dry-run with the kubernetes
// executor prints the Job and NetworkPolicy it would apply, reads no
// kubeconfig (KUBECONFIG names a file that does not exist), and shows no
// secret value.
func TestDryRunKubernetesNeedsNoCluster(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wf := filepath.Join(dir, "w.yaml")
	src := "on: push\nimage: alpine:3.20\nsecrets: [TOKEN]\nsteps:\n  - {name: s, secrets: [TOKEN], run: 'echo hi'}\n"
	if err := os.WriteFile(wf, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TOKEN": "hunter2-dry", "KUBECONFIG": filepath.Join(dir, "nonexistent"), "HOME": filepath.Join(dir, "home")}
	r := runCLI(t, env, "run", "--executor", "kubernetes", "--dry-run", "--workflow", wf, "--secret", "TOKEN", "--run-id", "rdry", "--namespace", "ci")
	for _, want := range []string{"kind: Job", "name: knotless-rdry", "namespace: ci", "image: alpine:3.20", "kind: NetworkPolicy", "export TOKEN='***'"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dry run output lacks %q", want)
		}
	}
	if r.code != ExitSuccess || strings.Contains(r.stdout+r.stderr, "hunter2-dry") {
		t.Errorf("exit %d (want 0, and no secret value), stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestDryRunImagePullSecrets: a --image-pull-secret is in the Job's pod
// spec when its pattern matches the run's image, and for an untrusted
// run only when marked untrusted; an untrusted run whose image a
// withheld secret matches pulls Always.
func TestDryRunImagePullSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wf := filepath.Join(dir, "w.yaml")
	if err := os.WriteFile(wf, []byte("on: push\nsteps: [{run: 'true'}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KUBECONFIG": filepath.Join(dir, "nonexistent"), "HOME": filepath.Join(dir, "home")}
	args := []string{"run", "--executor", "kubernetes", "--dry-run", "--workflow", wf, "--namespace", "ci", "--image", "registry.example.com/ci/base:1",
		"--image-pull-secret", "ci-pull=registry.example.com/ci/*", "--image-pull-secret", "mirror-pull=registry.example.com/ci/base:*,untrusted",
		"--image-pull-secret", "other-pull=registry.example.com/other/*"}
	for _, tt := range []struct {
		name   string
		args   []string
		want   string
		policy string
	}{
		{"trusted", nil, "imagePullSecrets:\n      - name: ci-pull\n      - name: mirror-pull\n", "imagePullPolicy: IfNotPresent"},
		{"untrusted", []string{"--untrusted"}, "imagePullSecrets:\n      - name: mirror-pull\n", "imagePullPolicy: Always"},
	} {
		r := runCLI(t, env, append(args, tt.args...)...)
		if r.code != ExitSuccess || !strings.Contains(r.stdout, tt.want) || !strings.Contains(r.stdout, tt.policy) || strings.Contains(r.stdout, "other-pull") {
			t.Errorf("%s: exit %d, want 0, %q and %q, and no other-pull; stdout:\n%s\nstderr:\n%s", tt.name, r.code, tt.want, tt.policy, r.stdout, r.stderr)
		}
	}
}

// TestDryRunEgress: a trusted run's pod is labelled open and only the
// ingress policy is shown; an untrusted run's pod is labelled public, and
// the public policy selecting it is shown too; --egress-untrusted
// changes that.
func TestDryRunEgress(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wf := filepath.Join(dir, "w.yaml")
	if err := os.WriteFile(wf, []byte("on: push\nsteps: [{run: 'true'}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"KUBECONFIG": filepath.Join(dir, "nonexistent"), "HOME": filepath.Join(dir, "home")}
	args := []string{"run", "--executor", "kubernetes", "--dry-run", "--workflow", wf, "--namespace", "ci", "--run-id", "reg"}
	for _, tt := range []struct {
		name    string
		args    []string
		want    []string
		notWant []string
	}{
		{"trusted", nil, []string{"dev.knotless.egress: open", "name: knotless-deny-ingress-"}, []string{"name: knotless-egress-"}},
		{"untrusted", []string{"--untrusted"}, []string{"dev.knotless.egress: public", "name: knotless-deny-ingress-", "name: knotless-egress-public-", "- 10.0.0.0/8", "- 169.254.0.0/16", "cidr: ::/0"}, nil},
		{"untrusted, deny", []string{"--untrusted", "--egress-untrusted", "deny"}, []string{"dev.knotless.egress: deny", "name: knotless-egress-deny-"}, []string{"egress: public"}},
		{"trusted, public", []string{"--egress", "public"}, []string{"dev.knotless.egress: public", "name: knotless-egress-public-"}, nil},
	} {
		r := runCLI(t, env, append(args, tt.args...)...)
		if r.code != ExitSuccess {
			t.Errorf("%s: exit %d\nstderr:\n%s", tt.name, r.code, r.stderr)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("%s: no %q in\n%s", tt.name, w, r.stdout)
			}
		}
		for _, w := range tt.notWant {
			if strings.Contains(r.stdout, w) {
				t.Errorf("%s: %q in\n%s", tt.name, w, r.stdout)
			}
		}
	}
}

// TestEgressBlocksThisHost: with public or allow-dns in either egress
// flag, every non-loopback address of this host is in the block list (a
// run pod must not reach the runner); with both open, none is read.
func TestEgressBlocksThisHost(t *testing.T) {
	t.Parallel()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var host []netip.Prefix
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
			ip, _ := netip.AddrFromSlice(n.IP)
			host = append(host, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
		}
	}
	if len(host) == 0 {
		// The Nix build sandbox has only loopback.
		t.Skip("SKIPPED: this host has no address but loopback, so there is no host address to block")
	}
	for _, tt := range []struct {
		flags KubeFlags
		want  bool
	}{
		{KubeFlags{Egress: "open", EgressUntrusted: "public"}, true},
		{KubeFlags{Egress: "allow-dns", EgressUntrusted: "deny"}, true},
		{KubeFlags{Egress: "open", EgressUntrusted: "open", EgressBlock: []string{"192.0.2.7"}}, false},
	} {
		eg, err := tt.flags.egress()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range host {
			if got := slices.Contains(eg.Block, p); got != tt.want {
				t.Errorf("--egress %s --egress-untrusted %s: %s in the block list %v: %v, want %v", tt.flags.Egress, tt.flags.EgressUntrusted, p, eg.Block, got, tt.want)
			}
		}
		if !slices.Contains(eg.Block, netip.MustParsePrefix("192.0.2.7/32")) && len(tt.flags.EgressBlock) > 0 {
			t.Errorf("--egress-block 192.0.2.7 is not in the block list %v", eg.Block)
		}
	}
}
