package run

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/tarstream"
)

// putCheckout sends the checkout and the step scripts into the session:
// in one transfer where the session has a Root for both, else one each.
// The checkout bound counts the whole stream, the scripts in it.
func (r *runState) putCheckout(ctx context.Context, sess executor.Session, dirs executor.Dirs) error {
	if fi, err := os.Stat(r.req.Checkout); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return fmt.Errorf("checkout %s: %w", r.req.Checkout, err)
	}
	start := time.Now()
	root, work, steps := "", "", ""
	if dirs.Root != "" && path.Dir(dirs.Work) == dirs.Root && path.Dir(dirs.Steps) == dirs.Root {
		root, work, steps = dirs.Root, path.Base(dirs.Work), path.Base(dirs.Steps)
	}
	n, err := r.retryCorrupt("checkout", func() (int64, error) {
		return transfer(ctx, func(w io.Writer) error {
			p := tarstream.NewPacker(ctx, w, r.eng.cfg.Checkout.Limits)
			if err := p.Tree(r.req.Checkout, work); err != nil {
				return err
			}
			if root != "" {
				if err := r.packScripts(p, steps); err != nil {
					return err
				}
			}
			return p.Close()
		}, func(rd io.Reader) error {
			if root != "" {
				return sess.Put(ctx, root, rd)
			}
			return sess.Put(ctx, dirs.Work, rd)
		})
	})
	if err != nil {
		return r.eng.cfg.Checkout.explain("checkout", fmt.Errorf("put checkout: %w", err))
	}
	if root == "" {
		var buf bytes.Buffer
		p := tarstream.NewPacker(ctx, &buf, tarstream.Limits{})
		if err := r.packScripts(p, ""); err != nil {
			return err
		}
		if err := p.Close(); err != nil {
			return err
		}
		if err := sess.Put(ctx, dirs.Steps, &buf); err != nil {
			return fmt.Errorf("put step scripts: %w", err)
		}
	}
	r.log.Info("checkout sent", "bytes", n, "with_scripts", root != "", "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// packScripts adds each step's script, named its step number under dir,
// and the directory the steps write their outputs files in (with an
// empty file, as a tar stream's directory is made by its first entry).
func (r *runState) packScripts(p *tarstream.Packer, dir string) error {
	for i, s := range r.scripts {
		if err := p.File(path.Join(dir, strconv.Itoa(i+1)), 0o755, s); err != nil {
			return fmt.Errorf("pack step scripts: %w", err)
		}
	}
	if err := p.File(path.Join(dir, executor.StepOutputsDir, ".keep"), 0o644, nil); err != nil {
		return fmt.Errorf("pack step scripts: %w", err)
	}
	return nil
}

// collectOutputs brings the session's outputs directory back and unpacks
// it, as hostile input, into the request's outputs directory.
func (r *runState) collectOutputs(ctx context.Context, sess executor.Session, dirs executor.Dirs) error {
	if r.req.Outputs == "" || r.res.Status == Cancelled || r.res.Status == Detached {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.eng.cfg.CleanupTimeout)
	defer cancel()
	if err := os.MkdirAll(r.req.Outputs, 0o755); err != nil {
		return fmt.Errorf("create outputs directory: %w", err)
	}
	// Unpack into a staging directory beside the outputs, so a refused or
	// corrupted transfer leaves nothing half-written among them.
	n, err := r.retryCorrupt("outputs", func() (int64, error) {
		stage, err := os.MkdirTemp(filepath.Dir(filepath.Clean(r.req.Outputs)), ".knotless-outputs-")
		if err != nil {
			return 0, fmt.Errorf("create staging directory: %w", err)
		}
		defer os.RemoveAll(stage)
		n, err := transfer(ctx, func(w io.Writer) error { return sess.Get(ctx, dirs.Outputs, w) },
			func(rd io.Reader) error { return tarstream.Unpack(ctx, rd, stage, r.eng.cfg.Outputs.Limits) })
		if err != nil {
			return n, err
		}
		return n, moveEntries(stage, r.req.Outputs)
	})
	if err != nil {
		return r.eng.cfg.Outputs.explain("outputs", fmt.Errorf("collect outputs: %w", err))
	}
	r.log.Info("outputs collected", "bytes", n)
	files, err := listFiles(r.req.Outputs)
	r.res.Outputs = files
	r.res.Artifacts = r.req.Workflow.Published(files)
	return err
}

// retryCorrupt runs a transfer again once when the two ends' digests
// differ, saying so in the run log.
func (r *runState) retryCorrupt(what string, do func() (int64, error)) (int64, error) {
	n, err := do()
	if errors.Is(err, executor.ErrTransferCorrupt) {
		r.logf("knotless-run: %s transfer corrupted (%v); sending it once more", what, err)
		r.log.Warn("transfer corrupted; retrying", "transfer", what, "err", err)
		n, err = do()
	}
	return n, err
}

// moveEntries moves each top-level entry of from into to, replacing an
// entry of the same name.
func moveEntries(from, to string) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range entries {
		dst := filepath.Join(to, e.Name())
		if err := os.RemoveAll(dst); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(from, e.Name()), dst); err != nil {
			return err
		}
	}
	return nil
}

func listFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	sort.Strings(files)
	return files, err
}

// transfer runs produce and consume over a pipe and returns the bytes
// that crossed it.
func transfer(ctx context.Context, produce func(io.Writer) error, consume func(io.Reader) error) (int64, error) {
	pr, pw := io.Pipe()
	counted := &tarstream.CountingWriter{W: pw}
	produced := make(chan error, 1)
	go func() {
		err := produce(counted)
		pw.CloseWithError(err)
		produced <- err
	}()
	cerr := consume(pr)
	pr.CloseWithError(errors.New("consumer finished"))
	perr := <-produced
	// A producer that stopped at a bound says why better than the
	// consumer that saw its stream break off.
	if cerr != nil && !passedBound(perr) {
		return counted.N, cerr
	}
	return counted.N, perr
}

// Bound limits one kind of transfer, and names the limits in the error a
// run ends with when a transfer passes one (the flags that set them). A
// zero limit is tarstream's default, not no bound.
type Bound struct {
	tarstream.Limits
	BytesName, FilesName string
}

func passedBound(err error) bool {
	return errors.Is(err, tarstream.ErrTooLarge) || errors.Is(err, tarstream.ErrTooManyFiles)
}

// explain puts the name of the bound a transfer of what passed in front
// of err.
func (b Bound) explain(what string, err error) error {
	name := func(n, fallback string) string {
		if n == "" {
			return fallback
		}
		return n
	}
	lim := b.Effective() // a zero field is tarstream's default
	switch {
	case errors.Is(err, tarstream.ErrTooLarge):
		return fmt.Errorf("%s exceed %s (%d bytes): %w", what, name(b.BytesName, "the size bound"), lim.MaxBytes, err)
	case errors.Is(err, tarstream.ErrTooManyFiles):
		return fmt.Errorf("%s exceed %s (%d files): %w", what, name(b.FilesName, "the file count bound"), lim.MaxFiles, err)
	}
	return err
}
