package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"knotless.dev/run/internal/lib/termsafe"
	"knotless.dev/run/internal/rules/workflow"
)

// ValidateCmd checks workflow files.
type ValidateCmd struct {
	Paths []string `arg:"" optional:"" help:"Workflow files, or directories to search for *.yaml (default: .knotless/workflows)."`
}

// Run validates every file and prints each error on a line of its own,
// then each warning: a field that is not acted on yet. A workflow that
// never runs (on: []) fails validation. What a file says is shown
// escaped (termsafe): the workflow may be a stranger's.
func (c *ValidateCmd) Run(env *Env) error {
	paths := c.Paths
	if len(paths) == 0 {
		paths = []string{workflow.Dir}
	}
	var files []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("validate %s: %w", p, err)
		}
		if !fi.IsDir() {
			files = append(files, p)
			continue
		}
		for _, pattern := range []string{"*.yaml", "*.yml"} {
			found, _ := filepath.Glob(filepath.Join(p, pattern))
			files = append(files, found...)
		}
	}
	if len(files) == 0 {
		return fmt.Errorf("validate: no workflow files in %s", strings.Join(paths, ", "))
	}
	bad := 0
	for _, f := range files {
		wf, err := workflow.Load(f)
		if err != nil {
			bad++
			fmt.Fprintln(env.Stdout, termsafe.Text(err.Error()))
			continue
		}
		for _, w := range wf.Warnings {
			fmt.Fprintln(env.Stdout, termsafe.Text(w.String()))
		}
		if wf.NeverRuns() {
			bad++
			continue
		}
		fmt.Fprintf(env.Stdout, "%s: ok\n", termsafe.Line(f))
		if wf.Matrix != nil {
			for i, leg := range wf.Legs() {
				fmt.Fprintf(env.Stdout, "  leg %d: %s\n", i+1, termsafe.Line(leg.Name))
			}
		}
	}
	if bad > 0 {
		fmt.Fprintf(env.Stderr, "knotless-run: %d of %d workflow files have errors\n", bad, len(files))
		return exitError{ExitFailure}
	}
	return nil
}
