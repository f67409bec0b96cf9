package clustertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHost is a "host off the pod network" for egress tests: a network
// namespace of the test's own, joined to the node's network namespace by a
// veth pair, with an address in a private test prefix that the node routes
// to it. It stands for everything outside the cluster, and it is the only
// target such a test ever has: nothing is sent to any real address.
type TestHost struct {
	Netns  string // the test host's network namespace
	IP     string // the test host's address
	NodeIP string // the node's address on the link to it

	nodeNetns string
}

// NewTestHost makes a test host on the link prefix cidr (a /30 such as
// 10.223.254.0/30: .1 is the node's end, .2 the host's) and removes it
// when the test ends.
func (c *Cluster) NewTestHost(t testing.TB, cidr string) *TestHost {
	t.Helper()
	if c.Info.NodeNetns == "" {
		t.Fatalf("clustertest: make a test host: %v", errNoNodeInfo)
	}
	base, ok := strings.CutSuffix(cidr, ".0/30")
	if !ok {
		t.Fatalf("clustertest: test host prefix %q: want a /30 ending in .0", cidr)
	}
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	id := hex.EncodeToString(b[:])
	h := &TestHost{
		Netns:     "ktc-testhost-" + id,
		IP:        base + ".2",
		NodeIP:    base + ".1",
		nodeNetns: c.Info.NodeNetns,
	}
	nodeEnd, hostEnd := "kth"+id+"n", "kth"+id+"h"
	t.Cleanup(func() {
		// Deleting the namespace deletes the veth pair with it.
		if out, err := exec.Command("ip", "netns", "delete", h.Netns).CombinedOutput(); err != nil {
			t.Errorf("clustertest: delete test host %s: %v: %s", h.Netns, err, out)
		}
	})
	steps := [][]string{
		{"ip", "netns", "add", h.Netns},
		{"ip", "link", "add", nodeEnd, "netns", h.nodeNetns, "type", "veth", "peer", "name", hostEnd, "netns", h.Netns},
		{"ip", "-n", h.nodeNetns, "addr", "add", h.NodeIP + "/30", "dev", nodeEnd},
		{"ip", "-n", h.nodeNetns, "link", "set", nodeEnd, "up"},
		{"ip", "-n", h.Netns, "link", "set", "lo", "up"},
		{"ip", "-n", h.Netns, "addr", "add", h.IP + "/30", "dev", hostEnd},
		{"ip", "-n", h.Netns, "link", "set", hostEnd, "up"},
		{"ip", "-n", h.Netns, "route", "add", "default", "via", h.NodeIP},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("clustertest: make test host: %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return h
}

// InHost runs a command in the test host's network namespace.
func (h *TestHost) InHost(ctx context.Context, args ...string) ([]byte, error) {
	return inNetns(ctx, h.Netns, args...)
}

// InNode runs a command in the node's network namespace (not in a pod).
func (h *TestHost) InNode(ctx context.Context, args ...string) ([]byte, error) {
	return inNetns(ctx, h.nodeNetns, args...)
}

func inNetns(ctx context.Context, netns string, args ...string) ([]byte, error) {
	full := append([]string{"netns", "exec", netns}, args...)
	out, err := exec.CommandContext(ctx, "ip", full...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("in netns %s: %s: %w: %s", netns, strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Listen starts a TCP listener on port in the test host that answers
// every connection with "hello", and a counting firewall rule for packets
// from srcCIDR to that port; it stops both when the test ends.
func (h *TestHost) Listen(t testing.TB, port int, srcCIDR string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := strconv.Itoa(port)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", h.Netns, "busybox", "nc", "-ll", "-p", p, "-e", "echo", "hello")
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("clustertest: start test host listener: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait() // killed: its error says so
	})
	if _, err := h.InHost(ctx, "iptables", "-w", "-A", "INPUT", "-p", "tcp", "-s", srcCIDR, "--dport", p,
		"-m", "comment", "--comment", "clustertest-count"); err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _ := h.InHost(ctx, "ss", "-Hltn", "sport = :"+p)
		if len(strings.TrimSpace(string(out))) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("clustertest: test host listener on port %s did not start", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Arrived returns how many packets from the Listen source prefix reached
// the test host's listening port.
func (h *TestHost) Arrived(ctx context.Context) (int64, error) {
	return ruleCounter(ctx, h.Netns, "filter", "INPUT", "clustertest-count")
}

// GuardDrops returns the packet counter of the node's egress guard rule.
func (h *TestHost) GuardDrops(ctx context.Context) (int64, error) {
	return ruleCounter(ctx, h.nodeNetns, "mangle", "FORWARD", "knotless-test egress guard")
}

// ruleCounter returns the packet counter of the iptables rule with the
// comment in a network namespace.
func ruleCounter(ctx context.Context, netns, table, chain, comment string) (int64, error) {
	out, err := inNetns(ctx, netns, "iptables", "-w", "-t", table, "-L", chain, "-v", "-x", "-n")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, "/* "+comment+" */") {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse counter of %q: %w", line, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("no rule %q in %s/%s of netns %s", comment, table, chain, netns)
}
