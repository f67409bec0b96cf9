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
	// Every file is read before any is judged: a workflow's needs name
	// the others (workflow.CheckNeeds).
	loaded := make([]*workflow.Workflow, len(files))
	loadErrs := make([]error, len(files))
	var good []*workflow.Workflow
	var invalid []string
	for i, f := range files {
		loaded[i], loadErrs[i] = workflow.Load(f)
		if loadErrs[i] != nil {
			invalid = append(invalid, workflow.FileName(loadErrs[i]))
			continue
		}
		good = append(good, loaded[i])
	}
	// A file given alone is checked against the other workflows of its
	// directory, which are read, not reported.
	good, invalid = withSiblings(files, good, invalid)
	needErrs := workflow.CheckNeeds(good, invalid...)
	bad := 0
	for i, f := range files {
		wf, err := loaded[i], loadErrs[i]
		if err == nil && len(needErrs[wf.Name]) > 0 {
			err = needErrs[wf.Name]
		}
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

// withSiblings adds to the workflows read (good) and the names of the
// files that do not parse (invalid) those of the other workflow files
// in the directories of files, which were not given.
func withSiblings(files []string, good []*workflow.Workflow, invalid []string) ([]*workflow.Workflow, []string) {
	given := map[string]bool{}
	dirs := map[string]bool{}
	for _, f := range files {
		given[filepath.Clean(f)] = true
		dirs[filepath.Dir(filepath.Clean(f))] = true
	}
	for dir := range dirs {
		for _, pattern := range []string{"*.yaml", "*.yml"} {
			found, _ := filepath.Glob(filepath.Join(dir, pattern))
			for _, f := range found {
				if given[filepath.Clean(f)] {
					continue
				}
				wf, err := workflow.Load(f)
				if err != nil {
					invalid = append(invalid, workflow.FileName(err))
					continue
				}
				good = append(good, wf)
			}
		}
	}
	return good, invalid
}
