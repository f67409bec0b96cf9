package clustertest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/tests/clustertest"
)

// second is a second cluster beside the first: other names, ports and
// prefixes everywhere.
var second = []string{
	"KNOTLESS_CLUSTER_NAME=knotless-test-down",
	"KNOTLESS_CLUSTER_HOST_VETH=ktc9-host",
	"KNOTLESS_CLUSTER_NODE_VETH=ktc9-node",
	"KNOTLESS_CLUSTER_POD_BRIDGE=ktc9-pods",
	"KNOTLESS_CLUSTER_LINK_CIDR=10.225.255.0/30",
	"KNOTLESS_CLUSTER_HOST_IP=10.225.255.1",
	"KNOTLESS_CLUSTER_NODE_IP=10.225.255.2",
	"KNOTLESS_CLUSTER_POD_CIDR=10.225.0.0/24",
	"KNOTLESS_CLUSTER_SERVICE_CIDR=10.225.128.0/24",
	"KNOTLESS_CLUSTER_SERVICE_IP=10.225.128.1",
	"KNOTLESS_CLUSTER_APISERVER_PORT=28443",
	"KNOTLESS_CLUSTER_ETCD_PORT=24379",
	"KNOTLESS_CLUSTER_ETCD_PEER_PORT=24380",
	"KNOTLESS_CLUSTER_CONTROLLER_MANAGER_PORT=22257",
	"KNOTLESS_CLUSTER_SCHEDULER_PORT=22259",
	"KNOTLESS_CLUSTER_KUBELET_PORT=22250",
	"KNOTLESS_CLUSTER_KUBELET_HEALTHZ_PORT=22248",
	"KNOTLESS_CLUSTER_KUBE_ROUTER_HEALTH_PORT=22244",
	"KNOTLESS_CLUSTER_NODE2_HOST_VETH=ktc9-host2",
	"KNOTLESS_CLUSTER_NODE2_NODE_VETH=ktc9-node2",
	"KNOTLESS_CLUSTER_NODE2_POD_BRIDGE=ktc9-pods2",
	"KNOTLESS_CLUSTER_PEER_VETH1=ktc9-peer1",
	"KNOTLESS_CLUSTER_PEER_VETH2=ktc9-peer2",
}

const (
	secondDir    = "/var/lib/knotless-test-down"
	secondNetns  = "knotless-test-down-node"
	secondNetns2 = "knotless-test-down-node2" // its second node's (add-node)
)

// hostState is what of the host a cluster may change.
type hostState struct {
	sysctls map[string]string
	paths   map[string]bool
	ipsets  []string
	tables  []string
}

// hostSysctls are the host sysctls the node changes (the kubelet's); the
// node's net.* sysctls live in its own network namespace.
var hostSysctls = []string{"kernel.panic", "kernel.panic_on_oops", "vm.overcommit_memory"}

var hostPaths = []string{
	"/var/lib/kubelet", "/var/lib/kubelet/device-plugins/kubelet.sock", "/var/log/containers",
	"/run/containerd/s", "/var/lib/cni/results", "/run/netns",
}

func readHostState(t *testing.T) hostState {
	t.Helper()
	s := hostState{sysctls: map[string]string{}, paths: map[string]bool{}}
	for _, k := range hostSysctls {
		b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(k, ".", "/"))
		if err != nil {
			t.Fatal(err)
		}
		s.sysctls[k] = strings.TrimSpace(string(b))
	}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		s.paths[p] = err == nil
	}
	s.ipsets = strings.Fields(run(t, "ipset", "list", "-n"))
	for _, l := range strings.Split(run(t, "nft", "list", "tables"), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			s.tables = append(s.tables, l)
		}
	}
	return s
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestDownLeavesNothing brings up a second cluster beside the first, with
// its optional second node (add-node), runs a pod on each node, kills every one of its processes with SIGKILL (as CI's
// machine does to whatever a session left), runs down twice and then
// checks, without the scripts' help, that nothing of it is left.
func TestDownLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("clustertest: SKIPPED: brings up a second real cluster; -short is set")
	}
	if os.Geteuid() != 0 {
		t.Fatal("needs root, as the cluster scripts do")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	scripts, err := filepath.Abs("../cluster")
	if err != nil {
		t.Fatal(err)
	}
	before := readHostState(t)

	start := time.Now()
	if err := clustertest.Script(ctx, scripts, "up", second); err != nil {
		clustertest.Script(ctx, scripts, "down", second) //nolint:errcheck // best effort before failing
		t.Fatal(err)
	}
	t.Logf("second cluster up in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if err := clustertest.Script(ctx, scripts, "add-node", second); err != nil {
		clustertest.Script(ctx, scripts, "down", second) //nolint:errcheck // best effort before failing
		t.Fatal(err)
	}
	t.Logf("its second node added in %v", time.Since(start).Round(time.Millisecond))
	env, err := clustertest.ScriptEnv(ctx, scripts, second)
	if err != nil {
		t.Fatal(err)
	}
	c, err := clustertest.Connect(env[clustertest.EnvKubeconfig])
	if err != nil {
		t.Fatal(err)
	}
	c.Namespace = "default"
	j := job(c, "leftover", env[clustertest.EnvImage], "exec sleep 3600")
	if _, err := c.Clientset.BatchV1().Jobs("default").Create(ctx, j, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPod(ctx, "default", "app=leftover", clustertest.PodReady); err != nil {
		t.Fatal(err)
	}
	j2 := onNode(job(c, "leftover2", env[clustertest.EnvImage], "exec sleep 3600"), env[clustertest.EnvNode2Name])
	if _, err := c.Clientset.BatchV1().Jobs("default").Create(ctx, j2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForPod(ctx, "default", "app=leftover2", clustertest.PodReady); err != nil {
		t.Fatal(err)
	}

	// kill -9 every component and every containerd shim; the containers
	// themselves are left running.
	killed := 0
	for _, pid := range pidsMentioning(t, secondDir+"/") {
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			killed++
		}
	}
	t.Logf("killed %d processes with SIGKILL", killed)
	if killed < 12 { // 7 components, the second node's 3, and the pods' shims
		t.Errorf("killed only %d processes of the second cluster", killed)
	}

	for i := range 2 {
		start := time.Now()
		if err := clustertest.Script(ctx, scripts, "down", second); err != nil {
			t.Fatalf("down #%d: %v", i+1, err)
		}
		t.Logf("down #%d: %v", i+1, time.Since(start).Round(time.Millisecond))
	}

	// Processes.
	if pids := pidsMentioning(t, secondDir+"/"); len(pids) > 0 {
		t.Errorf("processes of the second cluster left: %v", pids)
	}
	// Mounts.
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (strings.HasPrefix(f[4], secondDir) || f[4] == "/run/netns/"+secondNetns || f[4] == "/run/netns/"+secondNetns2) {
			t.Errorf("mount left: %s", f[4])
		}
	}
	// Paths.
	for _, p := range []string{secondDir, "/run/netns/" + secondNetns, "/run/netns/" + secondNetns2, "/run/knotless-test-cluster/holders/knotless-test-down"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("path left: %s", p)
		}
	}
	// Links and addresses.
	links := run(t, "ip", "-o", "link", "show")
	for _, name := range []string{"ktc9-host", "ktc9-node", "ktc9-pods", "ktc9-host2", "ktc9-node2", "ktc9-pods2", "ktc9-peer1", "ktc9-peer2"} {
		if strings.Contains(links, " "+name+":") || strings.Contains(links, " "+name+"@") {
			t.Errorf("link left: %s", name)
		}
	}
	if addrs := run(t, "ip", "-o", "addr", "show"); strings.Contains(addrs, "10.225.") {
		t.Errorf("address of the second cluster left:\n%s", addrs)
	}
	if routes := run(t, "ip", "route", "show"); strings.Contains(routes, "10.225.") {
		t.Errorf("route of the second cluster left:\n%s", routes)
	}
	if nss := run(t, "ip", "netns", "list"); strings.Contains(nss, secondNetns) { // and secondNetns2
		t.Errorf("network namespace left: %s", nss)
	}
	// Cgroups.
	hier, err := filepath.Glob("/sys/fs/cgroup/*/knotless-test-down*")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hier {
		t.Errorf("cgroup left: %s", h)
	}
	// iptables, nftables, ipsets of the host.
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		if out := run(t, save); strings.Contains(out, "10.225.") || strings.Contains(out, "ktc9-") || strings.Contains(out, "knotless-test-down") || strings.Contains(out, "KUBE-ROUTER") {
			t.Errorf("%s shows rules of the second cluster:\n%s", save, out)
		}
	}
	after := readHostState(t)
	for _, set := range after.ipsets {
		if !slices.Contains(before.ipsets, set) {
			t.Errorf("ipset left: %s", set)
		}
	}
	// A new table is ours when it names the cluster or is empty, which
	// is what iptables-nft leaves behind (another program on this machine
	// may make tables of its own meanwhile, with rules in them).
	for _, table := range after.tables {
		if slices.Contains(before.tables, table) {
			continue
		}
		out := run(t, "nft", append([]string{"list"}, strings.Fields(table)...)...)
		if nftRules(out) == 0 || strings.Contains(out, "10.225.") || strings.Contains(out, "ktc9-") {
			t.Errorf("nftables table left: %s\n%s", table, out)
		}
	}
	// Sysctls and host paths, as they were.
	for k, v := range before.sysctls {
		if after.sysctls[k] != v {
			t.Errorf("sysctl %s: %s, was %s", k, after.sysctls[k], v)
		}
	}
	for p, existed := range before.paths {
		if !existed && after.paths[p] {
			t.Errorf("host path left: %s", p)
		}
	}
	if files, _ := filepath.Glob("/var/lib/cni/results/knotless-test-down-*"); len(files) > 0 {
		t.Errorf("CNI results left: %v", files)
	}
}

// pidsMentioning returns the processes whose command line contains s.
func pidsMentioning(t *testing.T, s string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		if strings.Contains(string(b), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// nftRules counts the rules in the output of nft list table.
func nftRules(listing string) int {
	n := 0
	for _, l := range strings.Split(listing, "\n") {
		if strings.HasPrefix(l, "\t\t") && !strings.HasPrefix(strings.TrimSpace(l), "type ") {
			n++
		}
	}
	return n
}
