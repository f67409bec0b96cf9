package executor

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestLost(t *testing.T) {
	t.Parallel()
	cause := fmt.Errorf("pod p was deleted: %w", context.Canceled)
	err := fmt.Errorf("step build: %w", Lost(cause))
	if !errors.Is(err, ErrInfrastructure) || !errors.Is(err, context.Canceled) {
		t.Errorf("%v: want both ErrInfrastructure and its cause in its chain", err)
	}
	if got, want := err.Error(), "step build: pod p was deleted: context canceled"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if errors.Is(cause, ErrInfrastructure) || Lost(nil) != nil {
		t.Error("Lost marked what it was not given")
	}
}
