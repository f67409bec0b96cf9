package run

import (
	"fmt"
	"math/big"
	"path"
	"time"

	"knotless.dev/run/internal/lib/quantity"
)

// Maximums are the operator's bounds on what a workflow may ask for. A
// pull's workflow is written by a stranger: without them it picks its
// own timeout, resources and image. Zero values bound nothing.
type Maximums struct {
	// Timeout is the longest run a workflow may ask for; a workflow that
	// sets no timeout gets this one.
	Timeout time.Duration
	// MilliCPU and MemoryBytes bound the workflow's resource requests.
	MilliCPU    int64
	MemoryBytes int64
	// Images are globs (path.Match: * stops at /) that an image a
	// workflow names must match; empty allows any image. The runner's
	// default image, used when a workflow names none, is always allowed.
	Images []string
	// All applies the maximums to trusted runs too; by default they
	// bound untrusted runs only.
	All bool
}

// LimitError is a run refused because its workflow asks for more than a
// maximum allows: the run ends with status Error, naming the limit.
type LimitError struct {
	// Flag is the limit's name as the operator sets it (max-timeout,
	// max-cpu, max-memory, allow-image).
	Flag string
	// What and Value are what the workflow asked for; Max the bound.
	What, Value, Max string
}

func (e *LimitError) Error() string {
	if e.Flag == "allow-image" {
		return fmt.Sprintf("%s %s is not allowed by --allow-image %s", e.What, e.Value, e.Max)
	}
	return fmt.Sprintf("%s %s exceeds --%s %s", e.What, e.Value, e.Flag, e.Max)
}

// applies reports whether the maximums bound a run.
func (m Maximums) applies(trusted bool) bool { return !trusted || m.All }

// check returns the first limit req's workflow exceeds, or nil.
func (m Maximums) check(req Request) error {
	if !m.applies(req.Trusted) {
		return nil
	}
	wf := req.Workflow
	if m.Timeout > 0 && wf.Timeout > m.Timeout {
		return &LimitError{Flag: "max-timeout", What: "timeout", Value: wf.Timeout.String(), Max: m.Timeout.String()}
	}
	if m.Timeout > 0 {
		for _, s := range wf.Steps {
			if s.Timeout > m.Timeout {
				return &LimitError{Flag: "max-timeout", What: "step " + s.Name + " timeout", Value: s.Timeout.String(), Max: m.Timeout.String()}
			}
		}
	}
	if err := overQuantity("max-cpu", "cpu", wf.Resources.CPU, big.NewRat(m.MilliCPU, 1000), m.MilliCPU); err != nil {
		return err
	}
	if err := overQuantity("max-memory", "memory", wf.Resources.Memory, big.NewRat(m.MemoryBytes, 1), m.MemoryBytes); err != nil {
		return err
	}
	if len(m.Images) > 0 && wf.Image != "" && !imageAllowed(m.Images, wf.Image) {
		return &LimitError{Flag: "allow-image", What: "image", Value: wf.Image, Max: joinGlobs(m.Images)}
	}
	// A service's image is run like the run's: the same globs bound it
	// (the runner's default image is no service's).
	for _, s := range wf.Steps {
		if len(m.Images) > 0 && s.Image != "" && !imageAllowed(m.Images, s.Image) {
			return &LimitError{Flag: "allow-image", What: "step " + s.Name + " image", Value: s.Image, Max: joinGlobs(m.Images)}
		}
	}
	for _, s := range wf.Services {
		if len(m.Images) > 0 && !imageAllowed(m.Images, s.Image) {
			return &LimitError{Flag: "allow-image", What: "service " + s.Name + " image", Value: s.Image, Max: joinGlobs(m.Images)}
		}
	}
	return nil
}

// overQuantity compares a requested quantity with a maximum (0: none).
// A request that does not read as a quantity is refused under a maximum:
// it cannot be shown to be within it.
func overQuantity(flag, what, value string, max *big.Rat, raw int64) error {
	if raw <= 0 || value == "" {
		return nil
	}
	shown := maxString(flag, raw)
	got, err := quantity.Parse(value)
	if err != nil {
		return &LimitError{Flag: flag, What: what, Value: fmt.Sprintf("%q (unreadable)", value), Max: shown}
	}
	if got.Cmp(max) > 0 {
		return &LimitError{Flag: flag, What: what, Value: value, Max: shown}
	}
	return nil
}

func maxString(flag string, n int64) string {
	if flag == "max-cpu" {
		if n%1000 == 0 {
			return fmt.Sprint(n / 1000)
		}
		return fmt.Sprintf("%dm", n)
	}
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"Ei", 60}, {"Pi", 50}, {"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.suffix)
		}
	}
	return fmt.Sprint(n)
}

func imageAllowed(globs []string, image string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, image); ok {
			return true
		}
	}
	return false
}

func joinGlobs(globs []string) string {
	s := ""
	for i, g := range globs {
		if i > 0 {
			s += ", "
		}
		s += g
	}
	return s
}

// ValidImageGlob reports whether glob is a well-formed path.Match
// pattern (for the operator's flags).
func ValidImageGlob(glob string) error {
	if _, err := path.Match(glob, ""); err != nil {
		return fmt.Errorf("image glob %q: %w", glob, err)
	}
	return nil
}

// timeout is the run's timeout: the workflow's, else the maximum's when
// one applies.
func (m Maximums) timeout(req Request) time.Duration {
	if req.Workflow.Timeout <= 0 && m.Timeout > 0 && m.applies(req.Trusted) {
		return m.Timeout
	}
	return req.Workflow.Timeout
}
