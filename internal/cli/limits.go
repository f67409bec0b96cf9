package cli

import (
	"fmt"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/lib/quantity"
)

// LimitFlags are the operator's maximums on what a workflow may ask
// for; run and serve share them.
type LimitFlags struct {
	MaxTimeout time.Duration `help:"Longest run a workflow may ask for; a workflow that sets no timeout gets this one (0: no maximum)." group:"limits"`
	MaxCPU     string        `name:"max-cpu" help:"Most CPU a workflow may request, a quantity like 2 or 500m." placeholder:"QUANTITY" group:"limits"`
	MaxMemory  string        `help:"Most memory a workflow may request, a quantity like 4Gi." placeholder:"QUANTITY" group:"limits"`
	AllowImage []string      `help:"Images a workflow may name: a glob as path.Match reads it (* stops at /), repeatable; none given allows any. The default image is always allowed." placeholder:"GLOB" group:"limits"`
}

// maximums reads the flags; all applies them to trusted runs too.
func (f *LimitFlags) maximums(all bool) (run.Maximums, error) {
	m := run.Maximums{Timeout: f.MaxTimeout, Images: f.AllowImage, All: all}
	if f.MaxTimeout < 0 {
		return m, usageError{fmt.Errorf("--max-timeout %s: want a positive duration", f.MaxTimeout)}
	}
	var err error
	if f.MaxCPU != "" {
		if m.MilliCPU, err = quantity.MilliCPU(f.MaxCPU); err != nil {
			return m, usageError{fmt.Errorf("--max-cpu: %w", err)}
		}
	}
	if f.MaxMemory != "" {
		if m.MemoryBytes, err = quantity.Bytes(f.MaxMemory); err != nil {
			return m, usageError{fmt.Errorf("--max-memory: %w", err)}
		}
	}
	for _, g := range f.AllowImage {
		if err := run.ValidImageGlob(g); err != nil {
			return m, usageError{fmt.Errorf("--allow-image: %w", err)}
		}
	}
	return m, nil
}
