package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The tenant pool: the harness's second kubelet (tests/cluster/add-node)
// as a node pool that a test-only scaler starts when one of the test's
// pods waits Pending for the pool's selector, and removes
// (tests/cluster/remove-node) once nothing runs on it. It does what a
// cluster autoscaler does with a pool whose minimum is zero, on the one
// machine: the node count is the proof that a run got a node when it
// needed one and that nothing the runner left behind holds it.

// PoolLabel is the node label of the tenant pool; a pod selects the pool
// with PoolLabel=PoolValue in its nodeSelector.
const (
	PoolLabel = "pool.knotless.dev/name"
	PoolValue = "tenant"
)

// PoolIdle is how long the pool's node must run nothing before the
// scaler removes it (cluster-autoscaler's scale-down-unneeded-time, 10
// minutes by default, made short for a test).
const PoolIdle = 5 * time.Second

// Pool is the tenant pool and its scaler.
type Pool struct {
	c   *Cluster
	log func(format string, args ...any)

	mu     sync.Mutex
	events []PoolEvent
}

// PoolEvent is one scaling of the pool.
type PoolEvent struct {
	At    time.Time
	Up    bool   // a node added; else removed
	Node  string // its name
	Nodes int    // nodes in the pool afterwards
}

// StartNodePool is StartExclusive for a test of the tenant pool: it waits
// for every other test (the pool changes the cluster's node set), removes
// the second node so that the pool starts at zero nodes, and runs the
// scaler until the test ends. Then it stops the scaler and leaves the
// cluster's node set as it found it: the second node back (unlabelled)
// if the cluster had one, none otherwise. tests/run-all.sh runs the tests
// that call it in its two-node phase.
func StartNodePool(t testing.TB) (*Cluster, *Pool) {
	t.Helper()
	c := start(t, syscall.LOCK_EX)
	if c.Info.Dir == "" {
		t.Fatalf("clustertest: the tenant pool: %v", errNoNodeInfo)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	had, err := c.hasSecondNode(ctx)
	if err != nil {
		t.Fatalf("clustertest: %v", err)
	}
	p := &Pool{c: c, log: t.Logf}
	if err := c.LoseSecondNode(ctx); err != nil {
		t.Fatalf("clustertest: empty the tenant pool: %v", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.run(runCtx)
	}()
	t.Cleanup(func() {
		stop()
		<-done
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		restore := c.LoseSecondNode
		if had {
			restore = c.AddSecondNode
		}
		if err := restore(ctx); err != nil {
			t.Errorf("clustertest: leave the node set as it was (second node: %v): %v", had, err)
		}
	})
	return c, p
}

// hasSecondNode says whether the cluster has its second node's Node.
func (c *Cluster) hasSecondNode(ctx context.Context) (bool, error) {
	env, err := ScriptEnv(ctx, c.Info.Scripts, []string{"KNOTLESS_CLUSTER_DIR=" + c.Info.Dir})
	if err != nil {
		return false, err
	}
	name := env[EnvNode2Name]
	if name == "" {
		return false, nil
	}
	_, err = c.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Selector is the node selector of pods for the pool.
func (p *Pool) Selector() map[string]string {
	return map[string]string{PoolLabel: PoolValue}
}

// Nodes returns the names of the pool's Nodes.
func (p *Pool) Nodes(ctx context.Context) ([]string, error) {
	nodes, err := p.c.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: PoolLabel + "=" + PoolValue})
	if err != nil {
		return nil, fmt.Errorf("list the pool's nodes: %w", err)
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Name)
	}
	return names, nil
}

// Events returns the scalings so far.
func (p *Pool) Events() []PoolEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]PoolEvent(nil), p.events...)
}

// poolState is what the scaler decides on.
type poolState struct {
	Waiting int           // the test's pods Pending, unschedulable, for the pool
	Nodes   int           // the pool's Nodes
	Busy    int           // pods on them not Succeeded or Failed
	Idle    time.Duration // since the pool's node last ran something
}

type poolAction int

const (
	poolKeep poolAction = iota
	poolUp
	poolDown
)

// decidePool is the scaler's rule, as a cluster autoscaler's for a pool
// whose minimum is zero and maximum one: a node when a pod waits for one
// and there is none; the node gone once it has run nothing for PoolIdle
// and nothing waits.
func decidePool(s poolState) poolAction {
	switch {
	case s.Nodes == 0 && s.Waiting > 0:
		return poolUp
	case s.Nodes > 0 && s.Busy == 0 && s.Waiting == 0 && s.Idle >= PoolIdle:
		return poolDown
	}
	return poolKeep
}

// run scales the pool until ctx ends, looking twice a second. A failed
// look is logged and tried again.
func (p *Pool) run(ctx context.Context) {
	busySince := time.Now()
	for {
		s, err := p.look(ctx)
		if err == nil {
			if s.Busy > 0 || s.Waiting > 0 || s.Nodes == 0 {
				busySince = time.Now()
			}
			s.Idle = time.Since(busySince)
			switch decidePool(s) {
			case poolUp:
				err = p.up(ctx)
				busySince = time.Now()
			case poolDown:
				err = p.down(ctx)
			}
		}
		if err != nil && ctx.Err() == nil {
			p.log("clustertest: the tenant pool's scaler: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (p *Pool) look(ctx context.Context) (poolState, error) {
	var s poolState
	pods, err := p.c.Clientset.CoreV1().Pods(p.c.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return s, fmt.Errorf("list pods: %w", err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName == "" && pod.Spec.NodeSelector[PoolLabel] == PoolValue && PodUnschedulable(pod) {
			s.Waiting++
		}
	}
	nodes, err := p.Nodes(ctx)
	if err != nil {
		return s, err
	}
	s.Nodes = len(nodes)
	for _, n := range nodes {
		// Every namespace's pods: whatever holds the node, the runner's
		// or not, keeps it.
		on, err := p.c.Clientset.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n})
		if err != nil {
			return s, fmt.Errorf("list pods on node %s: %w", n, err)
		}
		for _, pod := range on.Items {
			if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
				s.Busy++
			}
		}
	}
	return s, nil
}

// up adds the second node and labels it into the pool.
func (p *Pool) up(ctx context.Context) error {
	if err := p.c.AddSecondNode(ctx); err != nil {
		return fmt.Errorf("scale up: %w", err)
	}
	n, err := p.c.secondNode(ctx)
	if err != nil {
		return fmt.Errorf("scale up: %w", err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{PoolLabel: PoolValue}}})
	if err != nil {
		return fmt.Errorf("encode node patch: %w", err)
	}
	if _, err := p.c.Clientset.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("scale up: label node %s into the pool: %w", n.Name, err)
	}
	p.record(ctx, true, n.Name)
	return nil
}

// down removes the pool's node as a cloud removes a machine.
func (p *Pool) down(ctx context.Context) error {
	nodes, err := p.Nodes(ctx)
	if err != nil {
		return err
	}
	if err := p.c.LoseSecondNode(ctx); err != nil {
		return fmt.Errorf("scale down: %w", err)
	}
	for _, n := range nodes {
		p.record(ctx, false, n)
	}
	return nil
}

func (p *Pool) record(ctx context.Context, up bool, node string) {
	nodes, err := p.Nodes(ctx)
	if err != nil {
		p.log("clustertest: the tenant pool: %v", err)
	}
	e := PoolEvent{At: time.Now(), Up: up, Node: node, Nodes: len(nodes)}
	verb := "removed"
	if up {
		verb = "added"
	}
	p.log("clustertest: the tenant pool's scaler %s node %s: %d node(s) in the pool", verb, node, e.Nodes)
	p.mu.Lock()
	p.events = append(p.events, e)
	p.mu.Unlock()
}
