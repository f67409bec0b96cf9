package cli

import (
	"fmt"

	"knotless.dev/run/internal/rules/class"
)

// classes reads --class into the runner's resource classes, and refuses
// a setting --executor cannot apply, naming the class: Kubernetes has
// no process bound of a pod's own; Docker and the shell place no pods,
// and Docker's storage drivers mostly bound no container's disk; the
// shell bounds nothing.
func (f *ExecutorFlags) classes() (class.Set, error) {
	d, err := f.lookup()
	if err != nil {
		return class.Set{}, err
	}
	var cs []class.Class
	for _, spec := range f.Class {
		c, err := class.Parse(spec)
		if err != nil {
			return class.Set{}, usageError{err}
		}
		refuse := func(key string) error {
			return usageError{fmt.Errorf("--class %s: %s: the %s executor cannot apply it", c.Name, key, d.Name)}
		}
		switch d.Name {
		case "kubernetes":
			if c.Pids > 0 {
				return class.Set{}, usageError{fmt.Errorf("--class %s: pids: a Kubernetes pod has no process bound of its own (the kubelet's podPidsLimit bounds every pod)", c.Name)}
			}
		default:
			if len(c.NodeSelector) > 0 {
				return class.Set{}, refuse("node-selector")
			}
			if len(c.Tolerations) > 0 {
				return class.Set{}, refuse("toleration")
			}
			if c.EphemeralStorage != "" {
				return class.Set{}, refuse("ephemeral-storage")
			}
			if d.Name != "docker" && (c.CPU != "" || c.Memory != "" || c.Pids > 0) {
				return class.Set{}, refuse("cpu, memory and pids")
			}
		}
		cs = append(cs, c)
	}
	s, err := class.NewSet(cs)
	if err != nil {
		return class.Set{}, usageError{fmt.Errorf("--class: %w", err)}
	}
	return s, nil
}
