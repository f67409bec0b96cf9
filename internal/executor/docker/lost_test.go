package docker

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"knotless.dev/run/internal/executor"
)

// TestLostContainer: a step whose container is removed, or killed,
// under it (as a daemon restart or an operator does) ends with an error
// marked the infrastructure's, which a workflow's retry tries again;
// a step killed by KillStep in its running container, or that exits
// by a signal of its own, is not (it exits by that signal).
func TestLostContainer(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	ex := newExecutor(t, d, did, Config{})
	for _, tt := range []struct {
		name   string
		script string
		do     func(ctx context.Context, s *Session) error
		lost   bool
	}{
		{"removed", "", func(ctx context.Context, s *Session) error {
			_, err := ex.cli.ContainerRemove(ctx, s.id, client.ContainerRemoveOptions{Force: true})
			return err
		}, true},
		{"killed", "", func(ctx context.Context, s *Session) error {
			_, err := ex.cli.ContainerKill(ctx, s.id, client.ContainerKillOptions{})
			return err
		}, true},
		{"its step killed", "", func(ctx context.Context, s *Session) error { return s.KillStep(ctx, "1") }, false},
		{"killed by its own signal", "kill -KILL $$", func(context.Context, *Session) error { return nil }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startSession(t, ex, d.Image(), "lost-"+runner(t)[8:], executor.Resources{})
			script := tt.script
			if script == "" {
				script = "sleep 300"
			}
			startStep(t, s, "1", "echo started; "+script)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			followed := make(chan error, 1)
			go func() {
				_, err := s.FollowStep(ctx, "1", 0, &out)
				followed <- err
			}()
			// The step runs once its session is known (its launcher's).
			st, err := s.step("1")
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-st.sidKnown:
			case <-ctx.Done():
				t.Fatal("the step never started")
			}
			if err := tt.do(ctx, s); err != nil {
				t.Fatal(err)
			}
			err = <-followed
			if !tt.lost && err == nil {
				return // an exit, by a signal: the step's own
			}
			if got := errors.Is(err, executor.ErrInfrastructure); got != tt.lost {
				t.Errorf("followed to %v; lost to the infrastructure: %v, want %v", err, got, tt.lost)
			}
		})
	}
}
