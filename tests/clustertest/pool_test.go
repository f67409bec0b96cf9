package clustertest

import (
	"testing"
	"time"
)

// The tenant pool's scaler decides as a cluster autoscaler does for a
// pool of minimum zero and maximum one.
func TestDecidePool(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		s    poolState
		want poolAction
	}{
		{"nothing waits, no node", poolState{}, poolKeep},
		{"a pod waits, no node", poolState{Waiting: 1}, poolUp},
		{"a pod waits, the node is there", poolState{Waiting: 1, Nodes: 1}, poolKeep},
		{"the node runs a pod", poolState{Nodes: 1, Busy: 1, Idle: time.Hour}, poolKeep},
		{"the node idle, not long enough", poolState{Nodes: 1, Idle: PoolIdle - time.Millisecond}, poolKeep},
		{"the node idle long enough", poolState{Nodes: 1, Idle: PoolIdle}, poolDown},
		{"idle long enough, a pod waits again", poolState{Nodes: 1, Waiting: 1, Idle: PoolIdle}, poolKeep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := decidePool(tc.s); got != tc.want {
				t.Errorf("decidePool(%+v) = %v, want %v", tc.s, got, tc.want)
			}
		})
	}
}
