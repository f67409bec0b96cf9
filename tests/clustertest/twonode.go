package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The environment that tests/cluster/env prints once tests/cluster/add-node
// has given the cluster its optional second node.
const (
	EnvNode2Name           = "KNOTLESS_TEST_NODE2_NAME"
	EnvNode2Netns          = "KNOTLESS_TEST_NODE2_NETNS"
	EnvNode2IP             = "KNOTLESS_TEST_NODE2_IP"
	EnvNode2PodCIDR        = "KNOTLESS_TEST_NODE2_POD_CIDR"
	EnvNode2ContainerdSock = "KNOTLESS_TEST_NODE2_CONTAINERD_SOCK"
)

// Node describes the cluster's second node.
type Node struct {
	Name           string
	Netns          string // network namespace of the node and its pods
	IP             string
	PodCIDR        string
	ContainerdSock string
}

// StartTwoNodes is Start for a test that needs the cluster's second node
// (tests/cluster/add-node): it returns the cluster and that node, once
// the node is Ready. A cluster without one fails the test: such tests
// run only in the two-node phase of tests/run-all.sh. Under -short it
// skips, as Start does.
func StartTwoNodes(t testing.TB) (*Cluster, *Node) {
	t.Helper()
	return startTwoNodes(t, syscall.LOCK_SH)
}

// StartTwoNodesExclusive is StartTwoNodes for a test that disrupts the
// cluster (it loses the second node): it waits for every other test, as
// StartExclusive does.
func StartTwoNodesExclusive(t testing.TB) (*Cluster, *Node) {
	t.Helper()
	return startTwoNodes(t, syscall.LOCK_EX)
}

func startTwoNodes(t testing.TB, how int) (*Cluster, *Node) {
	t.Helper()
	c := start(t, how)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := c.secondNode(ctx)
	if err != nil {
		t.Fatalf("clustertest: this test needs the cluster's second node: %v", err)
	}
	return c, n
}

// secondNode finds the second node: from the environment, else from
// tests/cluster/env (add-node may have run after the test's environment
// was made), and waits until it is Ready.
func (c *Cluster) secondNode(ctx context.Context) (*Node, error) {
	get := os.Getenv
	if get(EnvNode2Name) == "" {
		var extra []string
		if c.Info.Dir != "" {
			extra = []string{"KNOTLESS_CLUSTER_DIR=" + c.Info.Dir}
		}
		env, err := ScriptEnv(ctx, c.Info.Scripts, extra)
		if err != nil {
			return nil, err
		}
		get = func(k string) string { return env[k] }
	}
	n := &Node{
		Name:           get(EnvNode2Name),
		Netns:          get(EnvNode2Netns),
		IP:             get(EnvNode2IP),
		PodCIDR:        get(EnvNode2PodCIDR),
		ContainerdSock: get(EnvNode2ContainerdSock),
	}
	if n.Name == "" {
		return nil, fmt.Errorf("the cluster has none (%s is not set, tests/cluster/env prints none): run tests/cluster/add-node", EnvNode2Name)
	}
	var last string
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		node, err := c.Clientset.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("the cluster has no Node %s (lost, and not added again?): run tests/cluster/add-node", n.Name)
		}
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s (%s: %s)", cond.Status, cond.Reason, cond.Message)
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		last = "no Ready condition yet"
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %s is not Ready: %w; last seen: %s", n.Name, err, last)
	}
	return n, nil
}

// LoseSecondNode loses the second node as a cloud loses a machine: every
// process of it (kubelet, containerd, kube-router and its pods) is
// killed, nothing of it is left on this machine, and its Node is
// deleted (tests/cluster/remove-node). AddSecondNode brings it back.
func (c *Cluster) LoseSecondNode(ctx context.Context) error {
	if c.Info.Dir == "" {
		return fmt.Errorf("lose the second node: %w", errNoNodeInfo)
	}
	return Script(ctx, c.Info.Scripts, "remove-node", []string{"KNOTLESS_CLUSTER_DIR=" + c.Info.Dir})
}

// AddSecondNode (re)makes the second node (tests/cluster/add-node) and
// returns once it is Ready.
func (c *Cluster) AddSecondNode(ctx context.Context) error {
	if c.Info.Dir == "" {
		return fmt.Errorf("add the second node: %w", errNoNodeInfo)
	}
	return Script(ctx, c.Info.Scripts, "add-node", []string{"KNOTLESS_CLUSTER_DIR=" + c.Info.Dir})
}

// AddCapacityOn is AddCapacity on one node only: after RemoveCapacity,
// the test's new pods can go to that node and to no other.
func (c *Cluster) AddCapacityOn(ctx context.Context, node string) error {
	c.capacityLabelled = true
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{c.capacityLabel(): "true"}}})
	if err != nil {
		return fmt.Errorf("encode node patch: %w", err)
	}
	if _, err := c.Clientset.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s: %w", node, err)
	}
	return nil
}

// GuardDrops returns the packet counter of the node's egress guard rule.
func (n *Node) GuardDrops(ctx context.Context) (int64, error) {
	return ruleCounter(ctx, n.Netns, "mangle", "FORWARD", "knotless-test egress guard")
}
