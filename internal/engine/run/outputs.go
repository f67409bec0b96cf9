package run

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/workflow"
)

// loadOutputs reads the steps' outputs files back from the session,
// before step i, which reads some of them: the whole outputs directory,
// as hostile input (regular files named by a step number before i, at
// most workflow.MaxOutputBytes each). The files are in the session, so
// a run taken up by another process reads them as this one would.
// Their problems are said in the log once per step.
func (r *runState) loadOutputs(ctx context.Context, sess executor.Session, dirs executor.Dirs, i int) error {
	// After a cancel, the steps that still run (always()) may read them.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.eng.cfg.CleanupTimeout)
	defer cancel()
	limit := int64(i)*(workflow.MaxOutputBytes+2048) + 16<<10
	pr, pw := io.Pipe()
	got := make(chan error, 1)
	go func() {
		err := sess.Get(ctx, path.Join(dirs.Steps, executor.StepOutputsDir), pw)
		pw.CloseWithError(err)
		got <- err
	}()
	outs, err := readOutputs(io.LimitReader(pr, limit), i)
	pr.CloseWithError(errors.New("outputs read"))
	if gerr := <-got; err == nil && gerr != nil {
		err = gerr
	}
	if err != nil {
		return fmt.Errorf("read the earlier steps' outputs: %w", err)
	}
	if r.outputsSaid == nil {
		r.outputsSaid = map[int]bool{}
	}
	r.outputs = workflow.Outputs{}
	for j, data := range outs {
		m, problems := workflow.ParseOutputs(data)
		r.outputs[j] = m
		if len(problems) > 0 && !r.outputsSaid[j] {
			r.outputsSaid[j] = true
			r.logf("knotless-run: the outputs of step %s: %s (left out)", r.req.Workflow.Steps[j].Name, strings.Join(problems, "; "))
		}
	}
	return nil
}

// readOutputs reads the outputs files of the steps before step i from
// a tar stream of the outputs directory: step index to contents.
func readOutputs(rd io.Reader, i int) (map[int][]byte, error) {
	out := map[int][]byte{}
	tr := tar.NewReader(rd)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(path.Clean(hdr.Name), "./")
		n, err := strconv.Atoi(name)
		if err != nil || n < 1 || n > i || strconv.Itoa(n) != name || hdr.Typeflag != tar.TypeReg {
			continue // the directory, its .keep, a later step's, anything else
		}
		if hdr.Size > workflow.MaxOutputBytes {
			return nil, fmt.Errorf("step %d wrote %d bytes of outputs, more than %d", n, hdr.Size, workflow.MaxOutputBytes)
		}
		data, err := io.ReadAll(io.LimitReader(tr, workflow.MaxOutputBytes+1))
		if err != nil {
			return nil, err
		}
		out[n-1] = data
	}
}
