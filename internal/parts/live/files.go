package live

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"knotless.dev/run/internal/lib/mask"
	"knotless.dev/run/internal/output"
)

// FilesConfig bounds the output files a runner keeps for download: per
// run, in all, and in time.
type FilesConfig struct {
	// MaxFiles is how many files of a run are kept (default 100);
	// MaxRunBytes how many bytes of them (default 64 MiB).
	MaxFiles    int
	MaxRunBytes int64
	// MaxBytes bounds the files of all runs together (default 1 GiB):
	// the runs that ended first go first to make room.
	MaxBytes int64
	// Retention is how long a run's files are kept (default an hour, as
	// the hub keeps an ended run's output).
	Retention time.Duration
}

func (c *FilesConfig) defaults() {
	if c.MaxFiles <= 0 {
		c.MaxFiles = 100
	}
	if c.MaxRunBytes <= 0 {
		c.MaxRunBytes = 64 << 20
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 1 << 30
	}
	if c.Retention <= 0 {
		c.Retention = time.Hour
	}
}

// files keeps runs' published output files on disk, by check, bounded:
// the files of a check's latest run that its workflow's artifacts name,
// copied masked out of its outputs directory (which is removed at the
// run's end) into dir. It is the one gate of publication: the
// listener's outputhttp.FileSource and what the pusher sends the output
// service are what it kept.
type files struct {
	cfg FilesConfig
	dir string
	now func() time.Time
	log *slog.Logger

	mu    sync.Mutex
	runs  map[string]*keptRun // by check AT-URI
	total int64
}

// keptRun is one run's files: their paths, sizes and names under dir.
type keptRun struct {
	run   string
	dir   string
	files []output.File
	names map[string]string // path → file under dir
	bytes int64
	at    time.Time
}

// newFiles keeps files under dir, which it empties: the files of an
// earlier process are not served (nor is its output, which was in its
// memory).
func newFiles(cfg FilesConfig, dir string, log *slog.Logger) (*files, error) {
	cfg.defaults()
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("empty %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	return &files{cfg: cfg, dir: dir, now: time.Now, log: log, runs: map[string]*keptRun{}}, nil
}

// keep copies the files of check's run out of outDir (paths relative to
// it: the run's run.Result.Artifacts, the outputs its workflow
// publishes), within the bounds, in place of the files kept of an
// earlier run of check, and returns those kept. Each file's bytes are
// copied through m (run.Result.Mask), so a granted secret a step wrote
// into one is masked as in the log. A path that leads out of outDir (a
// symbolic link), is not a regular file, or whose name has a control
// or bidirectional formatting character is not kept (logged).
func (f *files) keep(check, run, outDir string, paths []string, m *mask.Set) []output.File {
	f.mu.Lock()
	f.dropLocked(check)
	f.sweepLocked()
	f.mu.Unlock()
	if len(paths) == 0 {
		return nil
	}
	root, err := os.OpenRoot(outDir)
	if err != nil {
		f.log.Warn("output files not kept", "check", check, "err", err)
		return nil
	}
	defer root.Close()
	sum := sha256.Sum256([]byte(check + "\n" + run))
	r := &keptRun{run: run, dir: filepath.Join(f.dir, hex.EncodeToString(sum[:16])), names: map[string]string{}, at: f.now()}
	if err := os.MkdirAll(r.dir, 0o700); err != nil {
		f.log.Warn("output files not kept", "check", check, "err", err)
		return nil
	}
	paths = append([]string(nil), paths...)
	sort.Strings(paths)
	for _, p := range paths {
		if len(r.files) == f.cfg.MaxFiles {
			f.log.Warn("more output files than a run keeps; the rest are not kept", "check", check, "max", f.cfg.MaxFiles)
			break
		}
		size, err := f.copy(root, p, r, m)
		if err != nil {
			f.log.Warn("output file not kept", "check", check, "path", p, "err", err)
			continue
		}
		r.files = append(r.files, output.File{Path: p, Size: size})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropLocked(check) // a run of check kept meanwhile (none: runs of a check do not overlap)
	f.runs[check] = r
	return r.files
}

// errBounds refuses a file past the bounds.
var errBounds = errors.New("past the bounds on kept output files")

// copy copies path of root into r through m, within the bounds, and
// returns the size of the copy.
func (f *files) copy(root *os.Root, p string, r *keptRun, m *mask.Set) (int64, error) {
	if err := output.CleanPath(p); err != nil {
		return 0, err
	}
	in, err := root.Open(filepath.FromSlash(p))
	if err != nil {
		return 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	size := fi.Size()
	if r.bytes+size > f.cfg.MaxRunBytes {
		return 0, fmt.Errorf("%w: %d bytes, the run's files may have %d more", errBounds, size, f.cfg.MaxRunBytes-r.bytes)
	}
	name := strconv.Itoa(len(r.files))
	out, err := os.OpenFile(filepath.Join(r.dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	// The copy reserves its bytes as they are written: masking changes
	// the size (*** for each value).
	w := &reserving{f: f, out: out, room: f.cfg.MaxRunBytes - r.bytes}
	mw := m.Writer(w)
	_, err = io.Copy(mw, io.LimitReader(in, size))
	if err == nil {
		err = mw.Flush()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		f.release(w.n)
		_ = os.Remove(filepath.Join(r.dir, name))
		return 0, err
	}
	r.names[p] = name
	r.bytes += w.n
	return w.n, nil
}

// reserving writes a kept file, taking each write's bytes of the bound
// on all files first and refusing to pass room, the run's.
type reserving struct {
	f    *files
	out  io.Writer
	room int64
	n    int64
}

func (w *reserving) Write(p []byte) (int, error) {
	n := int64(len(p))
	if w.n+n > w.room {
		return 0, fmt.Errorf("%w: more than the run's files may have", errBounds)
	}
	if !w.f.reserve(n) {
		return 0, fmt.Errorf("%w: more than all runs' files may have", errBounds)
	}
	w.n += n
	k, err := w.out.Write(p)
	if err == nil && k < len(p) {
		err = io.ErrShortWrite
	}
	return k, err
}

// reserve takes n bytes of the bound on all files, dropping the runs
// kept longest to make room; it reports whether there is room.
func (f *files) reserve(n int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n > f.cfg.MaxBytes {
		return false
	}
	for f.total+n > f.cfg.MaxBytes {
		oldest := ""
		for k, r := range f.runs {
			if oldest == "" || r.at.Before(f.runs[oldest].at) {
				oldest = k
			}
		}
		if oldest == "" {
			return false // the room is the run's being kept
		}
		f.dropLocked(oldest)
	}
	f.total += n
	return true
}

func (f *files) release(n int64) {
	f.mu.Lock()
	f.total -= n
	f.mu.Unlock()
}

// dropLocked forgets check's files and removes them. The caller holds
// mu.
func (f *files) dropLocked(check string) {
	r, ok := f.runs[check]
	if !ok {
		return
	}
	delete(f.runs, check)
	f.total -= r.bytes
	if err := os.RemoveAll(r.dir); err != nil {
		f.log.Warn("remove a run's kept files", "check", check, "err", err)
	}
}

// sweepLocked drops the runs kept past retention. The caller holds mu.
func (f *files) sweepLocked() {
	for k, r := range f.runs {
		if f.now().Sub(r.at) > f.cfg.Retention {
			f.dropLocked(k)
		}
	}
}

// Files lists the files kept of check's run (outputhttp.FileSource).
func (f *files) Files(check string) []output.File {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sweepLocked()
	if r, ok := f.runs[check]; ok {
		return append([]output.File(nil), r.files...)
	}
	return nil
}

// OpenFile opens a file kept of check's run (outputhttp.FileSource).
func (f *files) OpenFile(check, p string) (io.ReadSeekCloser, output.File, error) {
	f.mu.Lock()
	f.sweepLocked()
	r, ok := f.runs[check]
	var name string
	if ok {
		name, ok = r.names[p]
	}
	f.mu.Unlock()
	if !ok {
		return nil, output.File{}, output.ErrNotFound
	}
	file, err := os.Open(filepath.Join(r.dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, output.File{}, output.ErrNotFound // dropped meanwhile
	}
	if err != nil {
		return nil, output.File{}, err
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, output.File{}, err
	}
	return file, output.File{Path: p, Size: fi.Size()}, nil
}

// runFiles lists the files kept of run of check: none when they are
// another run's.
func (f *files) runFiles(check, run string) []output.File {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.runs[check]; ok && r.run == run {
		return append([]output.File(nil), r.files...)
	}
	return nil
}
