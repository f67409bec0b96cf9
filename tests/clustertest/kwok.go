package clustertest

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The capacity rig (tests/cluster/kwok-up): fake nodes that kwok's
// controller keeps Ready, to which the scheduler binds pods as to any
// node, and on which no container ever starts: a pod there stays
// Pending, bound, until deleted. They carry a taint that keeps every
// other test's pods off them; a pod gets there by tolerating it and
// selecting KwokLabel.
const (
	KwokLabel = "knotless.test/kwok"
	KwokValue = "true"
	KwokTaint = "kwok.x-k8s.io/node"
	// KwokClass is the --class flag of a resource class whose runs go
	// to the fake nodes (class.Parse reads it).
	KwokClass = "kwok:node-selector=" + KwokLabel + "=" + KwokValue + ",toleration=" + KwokTaint + "=fake:NoSchedule"
)

// Kwok is the capacity rig of one test.
type Kwok struct {
	c     *Cluster
	Nodes int // fake nodes Ready
}

// StartKwok is StartExclusive with the capacity rig: it adds n fake
// nodes (tests/cluster/kwok-up) and removes them and kwok's controller
// when the test ends, failed or not (kwok-down), before its namespace
// goes. Exclusive: hundreds of nodes and their leases load the API
// server that the other tests share, and a test that counts the
// cluster's nodes would count them. tests/run-all.sh runs it in its
// phase of disruptive tests.
func StartKwok(t testing.TB, n int) (*Cluster, *Kwok) {
	t.Helper()
	c := start(t, syscall.LOCK_EX)
	if c.Info.Dir == "" || c.Info.Scripts == "" {
		t.Fatalf("clustertest: the capacity rig: %v", errNoNodeInfo)
	}
	env := []string{"KNOTLESS_CLUSTER_DIR=" + c.Info.Dir, "KNOTLESS_KWOK_NODES=" + strconv.Itoa(n)}
	// Registered before kwok-up runs: a kwok-up that fails half-way
	// removes what it added itself, and this runs again to be sure.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := Script(ctx, c.Info.Scripts, "kwok-down", env); err != nil {
			t.Errorf("clustertest: remove the capacity rig: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // a first build of kwok
	defer cancel()
	if err := Script(ctx, c.Info.Scripts, "kwok-up", env); err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	k := &Kwok{c: c}
	got, err := k.ReadyNodes(ctx)
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	if got != n {
		t.Fatalf("clustertest: the capacity rig has %d Ready fake nodes, want %d", got, n)
	}
	k.Nodes = got
	return c, k
}

// ReadyNodes counts the fake nodes whose Ready condition is true.
func (k *Kwok) ReadyNodes(ctx context.Context) (int, error) {
	nodes, err := k.c.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: KwokLabel + "=" + KwokValue})
	if err != nil {
		return 0, fmt.Errorf("list the fake nodes: %w", err)
	}
	ready := 0
	for _, n := range nodes.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type == "Ready" && cond.Status == "True" {
				ready++
			}
		}
	}
	return ready, nil
}
