package scheduler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/mask"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/workflow"
)

// A workflow's needs (workflow.Need): its run waits, queued, while a
// run it needs of the same work (the same event and commit, and each
// need's attempt of it: its check key) is in hand; then it runs if each
// of them ended success, with their artifacts in its checkout
// (workflow.ArtifactsDir), and else ends skipped, naming the need. See
// docs/design/needs.md.

// needKeys are the check keys of the runs j needs: each need's runs
// (a matrix's legs) for j's event.
func needKeys(j *job.Job) []string {
	if j.Workflow == nil {
		return nil
	}
	var keys []string
	for _, n := range j.Workflow.Needs {
		for _, r := range n.Runs {
			keys = append(keys, j.Event.CheckKey(r))
		}
	}
	return keys
}

// needsHeld reports whether a run j needs is in hand (waiting, running
// or being queued): j waits, and no worker claims it yet.
func (q *queue) needsHeld(j *job.Job) bool {
	for _, k := range needKeys(j) {
		if q.has(k) {
			return true
		}
	}
	return false
}

// waitsFor is what j's queued check says it waits for: the workflows
// of its needs whose runs are in hand; "" for none.
func (q *queue) waitsFor(j *job.Job) string {
	var names []string
	for _, n := range j.Workflow.Needs {
		for _, r := range n.Runs {
			if q.has(j.Event.CheckKey(r)) {
				names = append(names, n.Name)
				break
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	return "waits for " + strings.Join(names, ", ")
}

// needsVerdict says whether j may run, once no run it needs is in hand,
// from their checks (check: by key, as last written): each must be
// known and have ended success. why names the first need that did not.
func needsVerdict(j *job.Job, check func(key string) (forge.Check, bool)) (ok bool, why string) {
	for _, n := range j.Workflow.Needs {
		if len(n.Runs) == 0 {
			return false, fmt.Sprintf("needs %s, which is not a workflow at this commit", n.Name)
		}
		for _, r := range n.Runs {
			c, known := check(j.Event.CheckKey(r))
			switch {
			case !known:
				return false, fmt.Sprintf("needs %s, which did not run for this event", r)
			case c.Status != string(run.Success):
				return false, fmt.Sprintf("needs %s, which ended %s", r, c.Status)
			}
		}
	}
	return true, ""
}

// needsSkip ends t skipped, without a run, when a run it needs did not
// succeed; it reports whether it did.
func (s *Scheduler) needsSkip(ctx context.Context, t *task) bool {
	if len(t.Workflow.Needs) == 0 || t.adopt != nil {
		return false
	}
	ok, why := needsVerdict(t.Job, s.p.Checks.Get)
	if ok {
		return false
	}
	s.log.Info("not run: a run it needs did not succeed", "check", t.Key, "workflow", t.Workflow.Name, "why", why)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	s.p.Checks.Skipped(wctx, t.Event, t.Workflow.Name, why)
	return true
}

// artifactsKeep is how long the artifacts of a needed run are kept for
// the runs that need it (a re-run of one of them included).
const artifactsKeep = 24 * time.Hour

// keptDir is where the artifacts of the run of check key are kept for
// the runs that need it.
func (s *Scheduler) keptDir(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.facts.RunsDir, ".artifacts", hex.EncodeToString(sum[:16]))
}

// keepArtifacts copies the artifacts of t's run (res.Artifacts, paths
// in outDir) to its kept directory, when another workflow needs t's and
// the run succeeded; it drops the kept artifacts older than
// artifactsKeep. A file that leads out of outDir (a symbolic link) or
// is not a regular file is not kept.
func (s *Scheduler) keepArtifacts(t *task, res *run.Result, outDir string) {
	s.dropOldArtifacts()
	if !t.Workflow.Needed || res.Status != run.Success {
		return
	}
	dst := s.keptDir(t.Key)
	if err := os.RemoveAll(dst); err != nil {
		s.log.Warn("artifacts not kept for the runs that need them", "check", t.Key, "err", err)
		return
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		s.log.Warn("artifacts not kept for the runs that need them", "check", t.Key, "err", err)
		return
	}
	if err := copyFiles(outDir, dst, res.Artifacts, res.Mask); err != nil {
		s.log.Warn("artifacts not kept for the runs that need them", "check", t.Key, "err", err)
	}
}

// dropOldArtifacts removes the kept artifacts older than artifactsKeep.
func (s *Scheduler) dropOldArtifacts() {
	dir := filepath.Join(s.facts.RunsDir, ".artifacts")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > artifactsKeep {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// placeArtifacts puts the kept artifacts of the runs t needs into its
// checkout, at workflow.ArtifactsDir/<run>/<path>: whatever the tree
// has there goes first. A needed run that published none puts nothing;
// one whose artifacts are not kept here is an error.
func (s *Scheduler) placeArtifacts(t *task, checkout string) error {
	if len(t.Workflow.Needs) == 0 {
		return nil
	}
	root, err := os.OpenRoot(checkout)
	if err != nil {
		return fmt.Errorf("artifacts of the runs it needs: %w", err)
	}
	defer root.Close()
	if err := root.RemoveAll(workflow.ArtifactsDir); err != nil {
		return fmt.Errorf("artifacts of the runs it needs: clear %s: %w", workflow.ArtifactsDir, err)
	}
	for _, n := range t.Workflow.Needs {
		for _, r := range n.Runs {
			src := s.keptDir(t.Event.CheckKey(r))
			if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
				// Its run succeeded, so its directory was made, even for
				// no artifact: it was dropped, or made by another runner.
				return fmt.Errorf("the artifacts of %s are not kept on this runner (a needed run's are kept %s, by the runner that ran it): run %s again", r, artifactsKeep, n.Name)
			}
			names, err := listKept(src)
			if err != nil {
				return fmt.Errorf("artifacts of %s: %w", r, err)
			}
			if len(names) == 0 {
				continue
			}
			dst := path.Join(workflow.ArtifactsDir, r)
			if err := root.MkdirAll(dst, 0o755); err != nil {
				return fmt.Errorf("artifacts of %s: %w", r, err)
			}
			sub, err := root.OpenRoot(dst)
			if err != nil {
				return fmt.Errorf("artifacts of %s: %w", r, err)
			}
			err = copyInto(src, sub, names)
			sub.Close()
			if err != nil {
				return fmt.Errorf("artifacts of %s: %w", r, err)
			}
		}
	}
	return nil
}

// listKept lists the files kept under dir, slash-separated and
// relative to it; none when dir does not exist.
func listKept(dir string) ([]string, error) {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == dir {
			return fs.SkipAll
		}
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		names = append(names, filepath.ToSlash(rel))
		return err
	})
	return names, err
}

// copyFiles copies the regular files names (slash-separated, relative
// to from) from from to to, at the same paths, through m (the run's
// run.Result.Mask: a granted secret is masked as in the log and in
// the files published); from is read through an os.Root, so that no
// name leads out of it.
func copyFiles(from, to string, names []string, m *mask.Set) error {
	src, err := os.OpenRoot(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenRoot(to)
	if err != nil {
		return err
	}
	defer dst.Close()
	for _, name := range names {
		if err := copyOne(src, dst, name, m); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// copyInto copies the files names of from into the root dst.
func copyInto(from string, dst *os.Root, names []string) error {
	src, err := os.OpenRoot(from)
	if err != nil {
		return err
	}
	defer src.Close()
	for _, name := range names {
		if err := copyOne(src, dst, name, nil); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// copyOne copies the regular file name from src to dst, through m
// when it is not nil, refusing a name that is not a clean relative
// path.
func copyOne(src, dst *os.Root, name string, m *mask.Set) error {
	if !fs.ValidPath(name) || name == "." {
		return errors.New("not a clean relative path")
	}
	native := filepath.FromSlash(name)
	in, err := src.Open(native)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	if dir := path.Dir(name); dir != "." {
		if err := dst.MkdirAll(filepath.FromSlash(dir), 0o755); err != nil {
			return err
		}
	}
	out, err := dst.OpenFile(native, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm()&0o755|0o600)
	if err != nil {
		return err
	}
	var w io.Writer = out
	var mw *mask.Writer
	if m != nil {
		mw = m.Writer(out)
		w = mw
	}
	_, err = io.Copy(w, io.LimitReader(in, fi.Size()))
	if err == nil && mw != nil {
		err = mw.Flush()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
