// Package cache is the runner's store of workflow caches: tar streams of
// the directories a workflow names in `cache:`, kept between runs of the
// same repository and workflow, apart by trust.
//
// Per repository, workflow and cache path the store keeps layers, each a
// tar stream of the path as one run left it, and two references to them:
//
//   - the base, the newest layer a passing trusted push promoted, which
//     runs granted a secret start from;
//   - the apart base, the newest clean layer a passing trusted push
//     promoted, which every other run starts from: pulls, batches, and
//     pushes granted no secret.
//
// A layer is clean when the run that saved it was granted no secret and
// every layer it restored, of any of its caches, was clean (Clean); any
// other layer is tainted, and so is a layer saved before the store
// recorded the mark. Taint follows lineage: what a secret-bearing run
// wrote never reaches a run granted no secret, however many pushes
// restore and save it in between. The mark is kept in the layer's
// meta.json, and the apart base is read only when its layer carries it.
//
// A run saves the path into its own upper layer; only a passing trusted
// push promotes its upper (an atomic rename of a link; of two pushes the
// one with the higher Order wins, whatever the order they finish in).
// Every other upper is dropped.
//
// Past --cache-max-total, Evict removes layers of the repository holding
// the most bytes, least recently used first, until all fit: each
// repository is owed a fair share (FairShare), and one within it loses
// nothing while another floods.
//
// A layer is validated as it is saved, as hostile input: a name that
// climbs or is absolute, a link out of the tree, a device, a stream or
// an unpacked size over the bound is refused and nothing is kept. The
// store itself never unpacks a layer, so nothing in it can write outside
// the store.
package cache

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"knotless.dev/run/internal/lib/atomicfile"
	"knotless.dev/run/internal/lib/tarstream"
)

// Key names one cache: a path of a workflow of a repository.
type Key struct {
	Repo     string `json:"repo"`
	Workflow string `json:"workflow"`
	Path     string `json:"path"`
}

func (k Key) String() string { return k.Repo + " " + k.Workflow + " " + k.Path }

// id is the key's directory name in the store.
func (k Key) id() string {
	h := sha256.Sum256([]byte(k.Repo + "\x00" + k.Workflow + "\x00" + k.Path))
	return hex.EncodeToString(h[:12])
}

// Layer describes one saved layer.
type Layer struct {
	Run string `json:"run"`
	// Order ranks the pushes that may promote: the higher wins.
	Order string `json:"order,omitempty"`
	// Secrets says the run that wrote it was granted secrets.
	Secrets bool `json:"secrets,omitempty"`
	// Clean says the layer is untainted (see Clean). It is written only
	// when true, so a layer saved before the mark existed is tainted.
	Clean bool      `json:"clean,omitempty"`
	Bytes int64     `json:"bytes"`
	Saved time.Time `json:"saved"`
	// Used is when the layer was last saved or read.
	Used time.Time `json:"-"`
}

// Config configures a Store. A zero MaxBytes or MaxFiles is tarstream's
// default (a layer is never unbounded); a zero MaxTotal or DiskFloor
// means none.
type Config struct {
	// Dir is the store's directory (--cache-dir's caches).
	Dir string
	// MaxBytes bounds one layer: its tar stream and the sum of its
	// files' sizes (--cache-max).
	MaxBytes int64
	// MaxFiles bounds one layer's entries.
	MaxFiles int64
	// MaxTotal bounds all layers together (--cache-max-total); past it
	// Evict removes layers of the repositories over their fair share.
	MaxTotal int64
	// DiskFloor is the free space of Dir's file system below which
	// nothing is saved (--disk-floor).
	DiskFloor int64
	// freeSpace reports the free bytes of Dir's file system; tests set it.
	freeSpace func(dir string) (int64, error)
	now       func() time.Time
}

// Store is a cache store on the local disk.
type Store struct {
	cfg Config
}

// Errors a caller tells apart to log them.
var (
	// ErrCold means there is no base to start from yet.
	ErrCold = errors.New("cache is cold")
	// ErrDiskFloor means the store's disk is below --disk-floor.
	ErrDiskFloor = errors.New("free disk space is below --disk-floor")
	// ErrTooLarge means a layer passed --cache-max.
	ErrTooLarge = errors.New("cache exceeds --cache-max")
	// ErrNotClean comes with ErrCold: the apart base's layer is not
	// marked clean, so a run granted no secret does not read it.
	ErrNotClean = errors.New("the apart base is not marked clean (it was saved before the store recorded taint), so a run granted no secret does not read it")
)

// Open returns the store at cfg.Dir, creating the directory.
func Open(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errors.New("cache store: no directory")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("cache store %s: %w", cfg.Dir, err)
	}
	if cfg.freeSpace == nil {
		cfg.freeSpace = freeSpace
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	lim := tarstream.Limits{MaxBytes: cfg.MaxBytes, MaxFiles: cfg.MaxFiles}.Effective()
	cfg.MaxBytes, cfg.MaxFiles = lim.MaxBytes, lim.MaxFiles
	return &Store{cfg: cfg}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.cfg.Dir }

func freeSpace(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// The layout under Dir, per key:
//
//	<id>/key.json               the Key
//	<id>/lock                   flock for changes of the references
//	<id>/layers/<run>/data.tar  a layer's tar stream; its mtime is its last use
//	<id>/layers/<run>/meta.json its Layer
//	<id>/base  -> layers/<run>  the base (a symbolic link)
//	<id>/apart -> layers/<run>  the apart base
const (
	baseLink  = "base"
	apartLink = "apart"
	layersDir = "layers"
	dataFile  = "data.tar"
	metaFile  = "meta.json"
	keyFile   = "key.json"
	lockFile  = "lock"
)

func (s *Store) keyDir(k Key) string { return filepath.Join(s.cfg.Dir, k.id()) }

// Base opens the layer a run starts from: the base for a run granted a
// secret, the apart base for any other. It returns ErrCold when there is
// none, and when the apart base's layer is not marked clean (a store
// from before the mark). Reading it marks it used.
func (s *Store) Base(k Key, secrets bool) (*os.File, Layer, error) {
	link := readRef(secrets)
	dir := s.keyDir(k)
	target, err := os.Readlink(filepath.Join(dir, link))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Layer{}, ErrCold
	}
	if err != nil {
		return nil, Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	ldir, err := s.layerPath(dir, target)
	if err != nil {
		return nil, Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	meta, err := readMeta(ldir)
	if err != nil {
		return nil, Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	if !readable(link, meta) {
		return nil, Layer{}, fmt.Errorf("cache %s: run %s: %w: %w", k, meta.Run, ErrCold, ErrNotClean)
	}
	f, err := os.Open(filepath.Join(ldir, dataFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Layer{}, ErrCold // evicted meanwhile
	}
	if err != nil {
		return nil, Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	now := s.cfg.now()
	_ = os.Chtimes(filepath.Join(ldir, dataFile), now, now)
	meta.Used = now
	return f, meta, nil
}

// Clean is the rule of taint: the layers a run saves are clean when the
// run was granted no secret and every layer it restored, of any of its
// caches, was clean. A step can copy one cache path into another, so
// the taint is the run's, not one path's; a layer without the mark (an
// older store's) counts as tainted. A run whose caches were all cold
// passes on only its own grant.
func Clean(secrets bool, restored []Layer) bool {
	if secrets {
		return false
	}
	for _, l := range restored {
		if !l.Clean {
			return false
		}
	}
	return true
}

// readRef is the reference a run starts from: the base for a run granted
// a secret, the apart base for any other.
func readRef(secrets bool) string {
	if secrets {
		return baseLink
	}
	return apartLink
}

// readable says whether a run may start from layer l through ref: the
// apart base only when l is clean, whatever wrote the link.
func readable(ref string, l Layer) bool { return ref == baseLink || l.Clean }

// promotion says which references a promoted layer l takes, given the
// layers they name now (nil: none). The base takes the newest layer; the
// apart base the newest clean one, and any clean one over an apart base
// that is not clean (an older store's).
func promotion(l Layer, base, apart *Layer) (toBase, toApart bool) {
	toBase = base == nil || newer(l, *base)
	toApart = l.Clean && (apart == nil || !apart.Clean || newer(l, *apart))
	return toBase, toApart
}

// layerPath checks that a reference names a layer of this key.
func (s *Store) layerPath(dir, target string) (string, error) {
	run, ok := strings.CutPrefix(target, layersDir+"/")
	if !ok || !validRun(run) {
		return "", fmt.Errorf("reference to %q is not a layer", target)
	}
	return filepath.Join(dir, layersDir, run), nil
}

func validRun(run string) bool {
	if run == "" || run == "." || run == ".." || len(run) > 128 {
		return false
	}
	for _, c := range run {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// Save reads a tar stream from r into the upper layer of run, checking
// it as hostile input. meta gives the run's Order, Secrets and whether
// its layers are Clean (by Clean; a layer with Secrets never is). Below
// the disk floor it saves nothing and returns ErrDiskFloor; a layer over
// the bounds, or one with an entry that could leave its tree, is refused
// and nothing of it is kept.
func (s *Store) Save(ctx context.Context, k Key, run string, meta Layer, r io.Reader) (Layer, error) {
	if !validRun(run) {
		return Layer{}, fmt.Errorf("cache %s: run id %q is not a file name", k, run)
	}
	limit := s.cfg.MaxBytes
	if s.cfg.DiskFloor > 0 {
		free, err := s.cfg.freeSpace(s.cfg.Dir)
		if err != nil {
			return Layer{}, err
		}
		room := free - s.cfg.DiskFloor
		if room <= 0 {
			return Layer{}, fmt.Errorf("cache %s: %w (%d bytes free)", k, ErrDiskFloor, free)
		}
		if room < limit {
			limit = room
		}
	}
	dir := s.keyDir(k)
	if err := os.MkdirAll(filepath.Join(dir, layersDir), 0o700); err != nil {
		return Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	if _, err := os.Stat(filepath.Join(dir, keyFile)); err != nil {
		b, _ := json.Marshal(k)
		if err := atomicfile.Write(filepath.Join(dir, keyFile), b, 0o600); err != nil {
			return Layer{}, fmt.Errorf("cache %s: %w", k, err)
		}
	}
	ldir := filepath.Join(dir, layersDir, run)
	if err := os.RemoveAll(ldir); err != nil {
		return Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	stage, err := os.MkdirTemp(filepath.Join(dir, layersDir), ".save-")
	if err != nil {
		return Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	defer os.RemoveAll(stage)
	n, err := s.write(ctx, filepath.Join(stage, dataFile), r, limit)
	if err != nil {
		if errors.Is(err, tarstream.ErrTooLarge) || errors.Is(err, errUnpackedTooLarge) {
			if limit < s.cfg.MaxBytes {
				return Layer{}, fmt.Errorf("cache %s: %w (it would take the disk below it)", k, ErrDiskFloor)
			}
			return Layer{}, fmt.Errorf("cache %s: %w (%d bytes)", k, ErrTooLarge, s.cfg.MaxBytes)
		}
		return Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	meta.Run, meta.Bytes, meta.Saved = run, n, s.cfg.now().UTC()
	meta.Clean = meta.Clean && !meta.Secrets
	b, _ := json.Marshal(meta)
	if err := atomicfile.Write(filepath.Join(stage, metaFile), b, 0o600); err != nil {
		return Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	_ = os.Chtimes(filepath.Join(stage, dataFile), meta.Saved, meta.Saved)
	if err := os.Rename(stage, ldir); err != nil {
		return Layer{}, fmt.Errorf("cache %s: %w", k, err)
	}
	meta.Used = meta.Saved
	return meta, nil
}

var errUnpackedTooLarge = errors.New("files larger than the bound")

// write copies the tar stream r to name while checking every entry, and
// returns the bytes written.
func (s *Store) write(ctx context.Context, name string, r io.Reader, limit int64) (int64, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	counted := &tarstream.CountingWriter{W: f}
	in := io.TeeReader(tarstream.LimitReader(ctx, r, tarstream.Limits{MaxBytes: limit}), counted)
	if err := check(tar.NewReader(in), limit, s.cfg.MaxFiles); err != nil {
		return counted.N, err
	}
	// The end-of-archive padding after the last entry.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return counted.N, err
	}
	if err := f.Sync(); err != nil {
		return counted.N, err
	}
	return counted.N, f.Close()
}

// check reads every entry of tr and refuses what tarstream.Unpack would
// refuse, and a tree whose files' sizes add up past limit (a sparse file
// is small in the stream and huge unpacked).
func check(tr *tar.Reader, limit, maxFiles int64) error {
	var size, files int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name, err := tarstream.CleanName(hdr.Name)
		if err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		files++
		if files > maxFiles {
			return fmt.Errorf("%w (%d files)", tarstream.ErrTooManyFiles, maxFiles)
		}
		switch hdr.Typeflag {
		case tar.TypeDir, tar.TypeXGlobalHeader:
		case tar.TypeReg:
			if _, sparse := hdr.PAXRecords["GNU.sparse.map"]; sparse {
				return fmt.Errorf("tar entry %q: sparse files are not kept", hdr.Name)
			}
			size += hdr.Size
			if size > limit {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, errUnpackedTooLarge)
			}
		case tar.TypeSymlink:
			if err := tarstream.CheckLinkTarget(name, hdr.Linkname); err != nil {
				return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
			}
		case tar.TypeLink:
			if t, err := tarstream.CleanName(hdr.Linkname); err != nil || t == "." {
				return fmt.Errorf("tar entry %q: hard link to %q points outside the tree", hdr.Name, hdr.Linkname)
			}
		default:
			return fmt.Errorf("tar entry %q: type %q is not kept (devices, FIFOs, sparse files and others are refused)", hdr.Name, string(hdr.Typeflag))
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return err
		}
	}
}

// Promote makes run's upper the base when no run of a higher order
// promoted already, and the apart base when it is clean and newer than
// the apart base (promotion). When it takes neither, the upper is
// dropped and Promote returns false. The references change by atomic
// renames.
func (s *Store) Promote(k Key, run string) (bool, error) {
	dir := s.keyDir(k)
	unlock, err := lock(dir)
	if err != nil {
		return false, fmt.Errorf("cache %s: %w", k, err)
	}
	defer unlock()
	if !validRun(run) {
		return false, fmt.Errorf("cache %s: run id %q is not a file name", k, run)
	}
	meta, err := readMeta(filepath.Join(dir, layersDir, run))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // evicted before it could be promoted
	}
	if err != nil {
		return false, fmt.Errorf("cache %s: promote %s: %w", k, run, err)
	}
	var cur [2]*Layer
	var old []string
	for i, ref := range []string{baseLink, apartLink} {
		if m, ok := s.refMeta(dir, ref); ok {
			cur[i] = &m
		}
		t, _ := os.Readlink(filepath.Join(dir, ref))
		old = append(old, t)
	}
	toBase, toApart := promotion(meta, cur[0], cur[1])
	if !toBase && !toApart {
		return false, s.dropLocked(dir, run)
	}
	target := layersDir + "/" + run
	if toBase {
		if err := relink(dir, baseLink, target); err != nil {
			return false, fmt.Errorf("cache %s: %w", k, err)
		}
	}
	if toApart {
		if err := relink(dir, apartLink, target); err != nil {
			return toBase, fmt.Errorf("cache %s: %w", k, err)
		}
	}
	return true, s.releaseLocked(dir, old)
}

// newer says a is ranked above b: a higher order, and of equal orders
// the higher run id, so two stores given the same pushes agree.
func newer(a, b Layer) bool {
	if a.Order != b.Order {
		return a.Order > b.Order
	}
	return a.Run > b.Run
}

// Drop removes run's upper, unless it is referenced.
func (s *Store) Drop(k Key, run string) error {
	dir := s.keyDir(k)
	unlock, err := lock(dir)
	if err != nil {
		return fmt.Errorf("cache %s: %w", k, err)
	}
	defer unlock()
	return s.dropLocked(dir, run)
}

func (s *Store) dropLocked(dir, run string) error {
	if !validRun(run) {
		return fmt.Errorf("run id %q is not a file name", run)
	}
	for _, ref := range []string{baseLink, apartLink} {
		if t, err := os.Readlink(filepath.Join(dir, ref)); err == nil && t == layersDir+"/"+run {
			return nil
		}
	}
	return os.RemoveAll(filepath.Join(dir, layersDir, run))
}

// releaseLocked removes the layers that the references named before a
// promotion and name no more. Other uppers belong to runs still going
// (they drop or promote their own) or to runs that ended without (Evict
// takes those).
func (s *Store) releaseLocked(dir string, old []string) error {
	now := map[string]bool{}
	for _, ref := range []string{baseLink, apartLink} {
		if t, err := os.Readlink(filepath.Join(dir, ref)); err == nil {
			now[t] = true
		}
	}
	var errs []error
	for _, t := range old {
		if t == "" || now[t] {
			continue
		}
		if ldir, err := s.layerPath(dir, t); err == nil {
			errs = append(errs, os.RemoveAll(ldir))
		}
	}
	return errors.Join(errs...)
}

func (s *Store) refMeta(dir, ref string) (Layer, bool) {
	t, err := os.Readlink(filepath.Join(dir, ref))
	if err != nil {
		return Layer{}, false
	}
	ldir, err := s.layerPath(dir, t)
	if err != nil {
		return Layer{}, false
	}
	m, err := readMeta(ldir)
	return m, err == nil
}

func readMeta(ldir string) (Layer, error) {
	b, err := os.ReadFile(filepath.Join(ldir, metaFile))
	if err != nil {
		return Layer{}, err
	}
	var m Layer
	if err := json.Unmarshal(b, &m); err != nil {
		return Layer{}, fmt.Errorf("%s: %w", filepath.Join(ldir, metaFile), err)
	}
	if fi, err := os.Stat(filepath.Join(ldir, dataFile)); err == nil {
		m.Used = fi.ModTime()
	}
	return m, nil
}

// relink points ref at target by renaming a new link over it.
func relink(dir, ref, target string) error {
	tmp := filepath.Join(dir, "."+ref+".new")
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, ref)); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// lock takes the key directory's lock (an flock, so that a `knotless-run
// run` and a daemon on the same store agree too).
func lock(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// Entry is one cache as List shows it.
type Entry struct {
	Key    Key
	Base   *Layer // nil when cold
	Apart  *Layer // nil when there is none
	Uppers []Layer
	Bytes  int64 // all its layers
}

// List returns every cache in the store, sorted by key.
func (s *Store) List() ([]Entry, error) {
	dirs, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("list caches in %s: %w", s.cfg.Dir, err)
	}
	var out []Entry
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		dir := filepath.Join(s.cfg.Dir, d.Name())
		b, err := os.ReadFile(filepath.Join(dir, keyFile))
		if err != nil {
			continue // not a cache (a concurrent first save, or foreign)
		}
		var e Entry
		if err := json.Unmarshal(b, &e.Key); err != nil {
			return nil, fmt.Errorf("list caches: %s: %w", filepath.Join(dir, keyFile), err)
		}
		refs := map[string]string{}
		for _, ref := range []string{baseLink, apartLink} {
			if t, err := os.Readlink(filepath.Join(dir, ref)); err == nil {
				refs[ref] = strings.TrimPrefix(t, layersDir+"/")
			}
		}
		layers, _ := os.ReadDir(filepath.Join(dir, layersDir))
		for _, l := range layers {
			if strings.HasPrefix(l.Name(), ".") {
				continue
			}
			m, err := readMeta(filepath.Join(dir, layersDir, l.Name()))
			if err != nil {
				continue
			}
			e.Bytes += m.Bytes
			isRef := false
			if refs[baseLink] == l.Name() {
				e.Base, isRef = &m, true
			}
			if refs[apartLink] == l.Name() {
				mm := m
				e.Apart, isRef = &mm, true
			}
			if !isRef {
				e.Uppers = append(e.Uppers, m)
			}
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out, nil
}

// Remove removes every cache whose key matches: an empty field of match
// matches any value. It returns the keys removed.
func (s *Store) Remove(match Key) ([]Key, error) {
	entries, err := s.List()
	if err != nil {
		return nil, err
	}
	var removed []Key
	var errs []error
	for _, e := range entries {
		if match.Repo != "" && match.Repo != e.Key.Repo || match.Workflow != "" && match.Workflow != e.Key.Workflow || match.Path != "" && match.Path != e.Key.Path {
			continue
		}
		dir := s.keyDir(e.Key)
		unlock, err := lock(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// Rename away first, so a concurrent reader sees all or nothing.
		gone := filepath.Join(s.cfg.Dir, ".rm-"+e.Key.id())
		err = os.Rename(dir, gone)
		unlock()
		if err == nil {
			err = os.RemoveAll(gone)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cache %s: %w", e.Key, err))
			continue
		}
		removed = append(removed, e.Key)
	}
	return removed, errors.Join(errs...)
}

// Evict brings all layers together within --cache-max-total: it
// removes layers in the order of evictionPlan, sparing the layers of the
// run named spare (just saved) while their repository has others. It
// returns the layers it removed.
func (s *Store) Evict(spare string) ([]Evicted, error) {
	if s.cfg.MaxTotal <= 0 {
		return nil, nil
	}
	entries, err := s.List()
	if err != nil {
		return nil, err
	}
	var all []candidate
	seen := map[string]bool{}
	for _, e := range entries {
		add := func(l *Layer) {
			if l == nil || seen[e.Key.id()+"/"+l.Run] {
				return
			}
			seen[e.Key.id()+"/"+l.Run] = true
			all = append(all, candidate{e.Key, *l})
		}
		add(e.Base)
		add(e.Apart)
		for i := range e.Uppers {
			add(&e.Uppers[i])
		}
	}
	plan, share := evictionPlan(all, s.cfg.MaxTotal, spare)
	var out []Evicted
	var errs []error
	for _, c := range plan {
		if err := s.evict(c.key, c.layer.Run); err != nil {
			errs = append(errs, fmt.Errorf("evict cache %s run %s: %w", c.key, c.layer.Run, err))
			continue
		}
		out = append(out, Evicted{Key: c.key, Layer: c.layer, Share: share})
	}
	return out, errors.Join(errs...)
}

// Evicted is a layer Evict removed.
type Evicted struct {
	Key   Key
	Layer Layer
	// Share is each repository's fair share when it was removed
	// (FairShare); the layer's repository held more.
	Share int64
}

// candidate is a layer Evict may remove.
type candidate struct {
	key   Key
	layer Layer
}

// FairShare is the bytes each repository is owed of limit when the
// repositories hold usage bytes each: the largest level L such that all
// of them, each counted at most L, fit in limit. So L is limit divided
// equally among the repositories with caches, and what one holding less
// than its part leaves is divided among the others (max-min fairness).
// When all fit, it is limit: no repository is over.
func FairShare(usage map[string]int64, limit int64) int64 {
	us := make([]int64, 0, len(usage))
	for _, u := range usage {
		us = append(us, u)
	}
	sort.Slice(us, func(i, j int) bool { return us[i] < us[j] })
	left := limit
	for i, u := range us {
		equal := left / int64(len(us)-i)
		if u > equal {
			return equal
		}
		left -= u
	}
	return limit
}

// evictionPlan orders the layers to remove so that all fit in limit,
// and returns the fair share. Each time it takes the least recently used
// layer of the repository holding the most bytes, so only repositories
// over FairShare lose layers: while the total is over limit, the
// repositories over the share hold more than the excess, and the largest
// is one of them. Spare's layers go last within their repository.
func evictionPlan(layers []candidate, limit int64, spare string) ([]candidate, int64) {
	usage := map[string]int64{}
	byRepo := map[string][]candidate{}
	var total int64
	for _, c := range layers {
		usage[c.key.Repo] += c.layer.Bytes
		byRepo[c.key.Repo] = append(byRepo[c.key.Repo], c)
		total += c.layer.Bytes
	}
	share := FairShare(usage, limit)
	for _, cs := range byRepo {
		sort.Slice(cs, func(i, j int) bool {
			a, b := cs[i], cs[j]
			if sa, sb := a.layer.Run == spare, b.layer.Run == spare; sa != sb {
				return sb
			}
			if !a.layer.Used.Equal(b.layer.Used) {
				return a.layer.Used.Before(b.layer.Used)
			}
			if a.layer.Run != b.layer.Run {
				return a.layer.Run < b.layer.Run
			}
			return a.key.String() < b.key.String()
		})
	}
	var plan []candidate
	for total > limit {
		repo := ""
		for r, cs := range byRepo {
			if len(cs) > 0 && (repo == "" || larger(r, repo, usage, byRepo)) {
				repo = r
			}
		}
		if repo == "" {
			break
		}
		c := byRepo[repo][0]
		byRepo[repo] = byRepo[repo][1:]
		usage[repo] -= c.layer.Bytes
		total -= c.layer.Bytes
		plan = append(plan, c)
	}
	return plan, share
}

// larger says repository a goes before b: it holds more bytes, or as
// many and its next layer was used longer ago, or that too and its name
// sorts first.
func larger(a, b string, usage map[string]int64, byRepo map[string][]candidate) bool {
	if usage[a] != usage[b] {
		return usage[a] > usage[b]
	}
	if ua, ub := byRepo[a][0].layer.Used, byRepo[b][0].layer.Used; !ua.Equal(ub) {
		return ua.Before(ub)
	}
	return a < b
}

func (s *Store) evict(k Key, run string) error {
	dir := s.keyDir(k)
	unlock, err := lock(dir)
	if err != nil {
		return err
	}
	defer unlock()
	for _, ref := range []string{baseLink, apartLink} {
		if t, err := os.Readlink(filepath.Join(dir, ref)); err == nil && t == layersDir+"/"+run {
			if err := os.Remove(filepath.Join(dir, ref)); err != nil {
				return err
			}
		}
	}
	return os.RemoveAll(filepath.Join(dir, layersDir, run))
}
