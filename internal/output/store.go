package output

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"knotless.dev/run/internal/lib/termsafe"
)

// StoreConfig bounds an output service's store.
type StoreConfig struct {
	// Dir holds the runs, one directory each under runs/.
	Dir string
	// Limits bound each run's stream: the bytes kept of it (its first
	// Head and last Tail), its marks, its readers (Subscribers: a
	// quarter of MaxSubscribers when zero, so that one run's readers
	// leave room for the others').
	Limits Limits
	// MaxRunsPerRunner is how many runs of one runner are kept; an
	// ended one goes first when a new one needs the room, and a new run
	// is refused while all are live.
	MaxRunsPerRunner int
	// MaxFiles and MaxFileBytes bound each run's files.
	MaxFiles     int
	MaxFileBytes int64
	// Retention is how long a run is kept after it ended, or after its
	// last put when it never ended (its runner went away).
	Retention time.Duration
	// MaxSubscribers bounds the readers of all runs together (default
	// 4096).
	MaxSubscribers int
	Logger         *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Store keeps an output service's runs on disk, each with its stream,
// marks and files, bounded and with retention. Disk use is bounded by
// MaxRunsPerRunner runs of Limits.Head+Limits.Tail bytes, their marks
// and MaxFileBytes of files each, for each runner the service takes.
type Store struct {
	cfg  StoreConfig
	gate *gate

	mu   sync.Mutex
	runs map[string]*diskRun // by check
}

// diskRun is one run kept on disk. op serializes the changes to it and
// its meta file; the stream has its own lock for readers.
type diskRun struct {
	dir    string
	runner string
	stream *Stream

	op       sync.Mutex
	removed  bool
	dirty    bool      // state not in meta.json yet
	saved    time.Time // when meta.json was last written
	created  time.Time
	marks    int // marks written to marks.jsonl
	files    []storedFile
	nextFile int
	replaced []string // earlier runs of the check, refused from now on
}

type storedFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	Name string `json:"name"` // under files/
}

// meta is a run's meta.json: what is not in its head, tail and marks
// files.
type meta struct {
	Check     string       `json:"check"`
	Run       string       `json:"run"`
	Runner    string       `json:"runner"`
	Head      int64        `json:"head"`
	Tail      int64        `json:"tail"`
	HeadLen   int64        `json:"headLen"`
	TailStart int64        `json:"tailStart"`
	Size      int64        `json:"size"`
	Final     bool         `json:"final,omitempty"`
	Status    string       `json:"status,omitempty"`
	Created   time.Time    `json:"created"`
	Updated   time.Time    `json:"updated"`
	Ended     time.Time    `json:"ended,omitzero"`
	Marks     int          `json:"marks"`
	Started   []int        `json:"started,omitempty"`
	Files     []storedFile `json:"files,omitempty"`
	NextFile  int          `json:"nextFile,omitempty"`
	Replaced  []string     `json:"replaced,omitempty"`
}

// OpenStore opens (or makes) the store in cfg.Dir and loads the runs it
// keeps; a run whose files do not load is removed and logged.
func OpenStore(cfg StoreConfig) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxSubscribers <= 0 {
		cfg.MaxSubscribers = 4096
	}
	if cfg.Limits.Subscribers <= 0 {
		cfg.Limits.Subscribers = runShare(cfg.MaxSubscribers)
	}
	if cfg.Limits.Marks <= 0 {
		cfg.Limits.Marks = 8192
	}
	if cfg.Limits.Head < 0 || cfg.Limits.Tail <= 0 || cfg.MaxRunsPerRunner <= 0 || cfg.Retention <= 0 {
		return nil, errors.New("open output store: bounds must be positive")
	}
	st := &Store{cfg: cfg, gate: &gate{max: int64(cfg.MaxSubscribers)}, runs: map[string]*diskRun{}}
	runsDir := filepath.Join(cfg.Dir, "runs")
	if err := os.MkdirAll(runsDir, 0o700); err != nil {
		return nil, fmt.Errorf("open output store: %w", err)
	}
	entries, err := os.ReadDir(runsDir)
	if err != nil {
		return nil, fmt.Errorf("open output store: %w", err)
	}
	for _, e := range entries {
		dir := filepath.Join(runsDir, e.Name())
		r, err := st.load(dir)
		if err != nil {
			cfg.Logger.Warn("a kept run does not load; removed", "dir", dir, "err", err)
			_ = os.RemoveAll(dir)
			continue
		}
		st.runs[r.stream.check] = r
	}
	st.Sweep()
	return st, nil
}

func (st *Store) runDir(check string) string {
	sum := sha256.Sum256([]byte(check))
	return filepath.Join(st.cfg.Dir, "runs", hex.EncodeToString(sum[:16]))
}

func (st *Store) load(dir string) (*diskRun, error) {
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, err
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("meta.json: %w", err)
	}
	if m.Check == "" || st.runDir(m.Check) != dir || m.Tail <= 0 || m.Size < 0 || m.HeadLen > m.Head || m.TailStart > m.Size || m.Size-m.TailStart > m.Tail {
		return nil, errors.New("meta.json does not describe this run")
	}
	lim := st.cfg.Limits
	lim.Head, lim.Tail = m.Head, m.Tail // as it was made
	s := newStream(m.Check, m.Run, lim, fileSegment{filepath.Join(dir, "head")}, fileSegment{filepath.Join(dir, "tail")}, st.cfg.Now, st.gate)
	s.headLen, s.tailStart, s.size = m.HeadLen, m.TailStart, m.Size
	s.final, s.status, s.updated, s.ended = m.Final, m.Status, m.Updated, m.Ended
	for _, step := range m.Started {
		s.started[step] = true
	}
	marks, err := readMarks(filepath.Join(dir, "marks.jsonl"), m.Marks)
	if err != nil {
		return nil, err
	}
	s.marks = marks
	return &diskRun{dir: dir, runner: m.Runner, stream: s, created: m.Created, marks: len(marks),
		files: m.Files, nextFile: m.NextFile, replaced: m.Replaced}, nil
}

func readMarks(p string, n int) ([]Mark, error) {
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) && n == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ws []WireMark
	sc := bufio.NewScanner(f)
	for len(ws) < n && sc.Scan() {
		var w WireMark
		if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
			return nil, fmt.Errorf("marks.jsonl: %w", err)
		}
		ws = append(ws, w)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(ws) < n {
		return nil, fmt.Errorf("marks.jsonl has %d marks, meta.json says %d", len(ws), n)
	}
	return FromWire(ws)
}

// Stream returns the stream kept for check (a Source of outputhttp).
func (st *Store) Stream(check string) (*Stream, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.runs[check]
	if !ok {
		return nil, false
	}
	return r.stream, true
}

// Put applies a runner's putRunOutput: the input's bytes past the
// stream's size are appended, with their marks; a put past the size
// appends nothing. A put for another run than the check's stream is of
// starts the stream anew (the earlier run is refused from then on). It
// returns where the stream is: the runner sends from there next. The
// caller has checked that runner may put to the check.
func (st *Store) Put(runner string, in PutInput) (PutOutput, error) {
	marks, err := FromWire(in.Marks)
	if err != nil {
		return PutOutput{}, err
	}
	r, err := st.runFor(runner, in.Check, in.Run)
	if err != nil {
		return PutOutput{}, err
	}
	r.op.Lock()
	defer r.op.Unlock()
	if r.removed {
		return PutOutput{}, fmt.Errorf("put output of %s: %w", in.Check, ErrRunReplaced)
	}
	s := r.stream
	werr := s.apply(in, marks)
	size := s.Size()
	final, _ := s.Final()
	// meta.json is written at most every PersistEvery while the run
	// goes on, and at its end: after a crash the run is as it was a
	// moment before, and its runner puts the rest again.
	r.dirty = true
	if final || st.cfg.Now().Sub(r.saved) >= PersistEvery {
		if err := r.persist(st.cfg.Now()); err != nil {
			return PutOutput{}, err
		}
	}
	if werr != nil {
		return PutOutput{}, werr
	}
	return PutOutput{Size: size, Final: final}, nil
}

// PersistEvery is how often a live run's meta.json is written at most.
const PersistEvery = 250 * time.Millisecond

// Flush writes the meta.json of every run whose last puts are not in it
// (a service stopping).
func (st *Store) Flush() error {
	st.mu.Lock()
	runs := make([]*diskRun, 0, len(st.runs))
	for _, r := range st.runs {
		runs = append(runs, r)
	}
	st.mu.Unlock()
	var errs []error
	for _, r := range runs {
		r.op.Lock()
		if r.dirty && !r.removed {
			errs = append(errs, r.persist(st.cfg.Now()))
		}
		r.op.Unlock()
	}
	return errors.Join(errs...)
}

// runFor returns the run kept for check's run, making it when there is
// none (or one of another run).
func (st *Store) runFor(runner, check, run string) (*diskRun, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	old, ok := st.runs[check]
	if ok && old.stream.run == run {
		return old, nil
	}
	var replaced []string
	if ok {
		if slices.Contains(old.replaced, run) {
			return nil, fmt.Errorf("put output of %s run %s: %w", check, run, ErrRunReplaced)
		}
		replaced = append(old.replaced, old.stream.run)
		if len(replaced) > 8 {
			replaced = replaced[len(replaced)-8:]
		}
	}
	st.sweepLocked()
	if !ok && st.countLocked(runner) >= st.cfg.MaxRunsPerRunner && !st.dropOldestEndedLocked(runner) {
		return nil, fmt.Errorf("put output of %s: %w (%d of runner %s)", check, ErrTooManyRuns, st.cfg.MaxRunsPerRunner, runner)
	}
	if ok {
		st.removeLocked(check)
	}
	dir := st.runDir(check)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("put output of %s: %w", check, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o700); err != nil {
		return nil, fmt.Errorf("put output of %s: %w", check, err)
	}
	s := newStream(check, run, st.cfg.Limits, fileSegment{filepath.Join(dir, "head")}, fileSegment{filepath.Join(dir, "tail")}, st.cfg.Now, st.gate)
	r := &diskRun{dir: dir, runner: runner, stream: s, created: st.cfg.Now(), replaced: replaced}
	if err := r.persist(st.cfg.Now()); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	st.runs[check] = r
	return r, nil
}

func (st *Store) countLocked(runner string) int {
	n := 0
	for _, r := range st.runs {
		if r.runner == runner {
			n++
		}
	}
	return n
}

// dropOldestEndedLocked drops runner's run that ended first, if one did.
func (st *Store) dropOldestEndedLocked(runner string) bool {
	var oldest string
	var at time.Time
	for k, r := range st.runs {
		if r.runner != runner {
			continue
		}
		if ended, t := r.stream.endedAt(); ended && (oldest == "" || t.Before(at)) {
			oldest, at = k, t
		}
	}
	if oldest == "" {
		return false
	}
	st.removeLocked(oldest)
	return true
}

// removeLocked drops a run from the map and ends its stream, then
// removes its directory once no change to it is going on.
func (st *Store) removeLocked(check string) {
	r, ok := st.runs[check]
	if !ok {
		return
	}
	delete(st.runs, check)
	r.stream.close()
	r.op.Lock()
	r.removed = true
	if err := os.RemoveAll(r.dir); err != nil {
		st.cfg.Logger.Warn("remove a run's output", "check", check, "err", err)
	}
	r.op.Unlock()
}

// Sweep removes the runs past retention: ended longer than Retention
// ago, or never ended and not put to for as long.
func (st *Store) Sweep() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sweepLocked()
}

func (st *Store) sweepLocked() {
	now := st.cfg.Now()
	for k, r := range st.runs {
		s := r.stream
		s.mu.RLock()
		last := s.updated
		if s.final {
			last = s.ended
		}
		s.mu.RUnlock()
		if now.Sub(last) > st.cfg.Retention {
			st.removeLocked(k)
		}
	}
}

// Len is how many runs are kept.
func (st *Store) Len() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.runs)
}

// close ends the stream as it is: its readers read to its size and stop.
func (s *Stream) close() {
	s.mu.Lock()
	if !s.final {
		s.final, s.ended = true, s.now()
	}
	s.notifyLocked()
	s.mu.Unlock()
}

// apply appends what of a put extends the stream. The caller holds the
// run's op lock.
func (s *Stream) apply(in PutInput, marks []Mark) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.notifyLocked()
	if s.final {
		return nil
	}
	data := []byte(in.Data)
	if in.CutFrom != nil && *in.CutFrom <= s.size && in.Offset > s.size {
		// The runner no longer has the bytes up to Offset.
		s.skip(in.Offset)
	}
	if in.Offset > s.size {
		return nil // the runner rewinds to the size it is told
	}
	from := s.size
	if skip := from - in.Offset; skip < int64(len(data)) {
		data = data[skip:]
	} else {
		data = nil
	}
	end := from + int64(len(data))
	for _, m := range marks {
		if m.Offset < from || m.Offset >= end {
			continue
		}
		if m.Kind == MarkStepStart {
			if s.started[m.Step] {
				continue
			}
			s.started[m.Step] = true
		}
		s.addMark(m)
	}
	var err error
	if len(data) > 0 {
		err = s.append(data)
	}
	s.updated = s.now()
	if in.Final && in.Offset+int64(len(in.Data)) <= s.size {
		s.final, s.status, s.ended = true, in.Status, s.now()
	}
	return err
}

// persist writes the run's meta.json and the marks not written yet.
// The caller holds op (or the run is not shared yet).
func (r *diskRun) persist(now time.Time) error {
	s := r.stream
	s.mu.RLock()
	m := meta{
		Check: s.check, Run: s.run, Runner: r.runner, Head: s.lim.Head, Tail: s.lim.Tail,
		HeadLen: s.headLen, TailStart: s.tailStart, Size: s.size, Final: s.final, Status: s.status,
		Created: r.created, Updated: s.updated, Ended: s.ended, Marks: len(s.marks),
		Files: r.files, NextFile: r.nextFile, Replaced: r.replaced,
	}
	for step := range s.started {
		m.Started = append(m.Started, step)
	}
	newMarks := append([]Mark(nil), s.marks[min(r.marks, len(s.marks)):]...)
	s.mu.RUnlock()
	sort.Ints(m.Started)
	if len(newMarks) > 0 {
		f, err := os.OpenFile(filepath.Join(r.dir, "marks.jsonl"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("keep marks of %s: %w", s.check, err)
		}
		w := bufio.NewWriter(f)
		enc := json.NewEncoder(w)
		for _, wm := range ToWire(newMarks) {
			_ = enc.Encode(wm)
		}
		err = w.Flush()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("keep marks of %s: %w", s.check, err)
		}
		r.marks += len(newMarks)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	// Replaced whole, not synced: after a crash the run is as a put
	// before, and its runner puts the rest again.
	tmp := filepath.Join(r.dir, "meta.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("keep output of %s: %w", s.check, err)
	}
	if err := os.Rename(tmp, filepath.Join(r.dir, "meta.json")); err != nil {
		return fmt.Errorf("keep output of %s: %w", s.check, err)
	}
	r.dirty, r.saved = false, now
	return nil
}

// CleanPath checks a run file's path: relative, slash-separated, no
// empty, . or .. part, valid UTF-8 without control or bidi characters
// (termsafe.UnsafeRune: a name that reads as another), at most 1024
// bytes. The runner keeps and the service takes only such paths.
func CleanPath(p string) error {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrBadPath, p, why) }
	switch {
	case p == "" || len(p) > 1024:
		return bad("empty or longer than 1024 bytes")
	case !utf8.ValidString(p):
		return bad("not UTF-8")
	case strings.IndexFunc(p, unicode.IsControl) >= 0:
		return bad("a control character")
	case hasUnsafe(p):
		return bad("a bidi control character")
	case strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "." || strings.HasPrefix(p, "../") || p == "..":
		return bad("not a clean relative path")
	}
	return nil
}

func hasUnsafe(p string) bool { _, bad := termsafe.UnsafeRune(p); return bad }

// PutFile keeps one of a run's files, read from body: the run must be
// the check's current one, and its files stay within MaxFiles and
// MaxFileBytes (a path put again replaces the earlier file).
func (st *Store) PutFile(runner, check, run, p string, body io.Reader) (File, error) {
	if err := CleanPath(p); err != nil {
		return File{}, err
	}
	st.mu.Lock()
	r, ok := st.runs[check]
	st.mu.Unlock()
	if !ok || r.stream.run != run || r.runner != runner {
		return File{}, fmt.Errorf("put file of %s run %s: %w", check, run, ErrNotFound)
	}
	// Read the body before taking the run's lock: a slow upload holds
	// up no one else.
	r.op.Lock()
	if r.removed {
		r.op.Unlock()
		return File{}, fmt.Errorf("put file of %s: %w", check, ErrNotFound)
	}
	room, count := st.cfg.MaxFileBytes, 0
	for _, f := range r.files {
		if f.Path != p {
			room -= f.Size
			count++
		}
	}
	r.op.Unlock()
	if count >= st.cfg.MaxFiles {
		return File{}, fmt.Errorf("put file %s of %s: %w (%d)", p, check, ErrTooManyFiles, st.cfg.MaxFiles)
	}
	tmp, err := os.CreateTemp(filepath.Join(r.dir, "files"), ".upload-")
	if err != nil {
		return File{}, fmt.Errorf("put file %s of %s: %w", p, check, err)
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(body, max(room, 0)+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return File{}, fmt.Errorf("put file %s of %s: %w", p, check, err)
	}
	if n > room {
		return File{}, fmt.Errorf("put file %s of %s: %w (%d bytes for all of a run's files)", p, check, ErrFileTooLarge, st.cfg.MaxFileBytes)
	}

	r.op.Lock()
	defer r.op.Unlock()
	if r.removed {
		return File{}, fmt.Errorf("put file of %s: %w", check, ErrNotFound)
	}
	// Checked again: another upload may have been kept meanwhile.
	room, count = st.cfg.MaxFileBytes, 0
	for _, f := range r.files {
		if f.Path != p {
			room -= f.Size
			count++
		}
	}
	if count >= st.cfg.MaxFiles || n > room {
		return File{}, fmt.Errorf("put file %s of %s: %w", p, check, ErrFileTooLarge)
	}
	name := strconv.Itoa(r.nextFile)
	if err := os.Rename(tmp.Name(), filepath.Join(r.dir, "files", name)); err != nil {
		return File{}, fmt.Errorf("put file %s of %s: %w", p, check, err)
	}
	r.nextFile++
	files := slices.DeleteFunc(slices.Clone(r.files), func(f storedFile) bool {
		if f.Path == p {
			_ = os.Remove(filepath.Join(r.dir, "files", f.Name))
			return true
		}
		return false
	})
	r.files = append(files, storedFile{Path: p, Size: n, Name: name})
	if err := r.persist(st.cfg.Now()); err != nil {
		return File{}, err
	}
	return File{Path: p, Size: n}, nil
}

// Files lists check's files (a FileSource of outputhttp).
func (st *Store) Files(check string) []File {
	st.mu.Lock()
	r, ok := st.runs[check]
	st.mu.Unlock()
	if !ok {
		return nil
	}
	r.op.Lock()
	defer r.op.Unlock()
	out := make([]File, 0, len(r.files))
	for _, f := range r.files {
		out = append(out, File{Path: f.Path, Size: f.Size})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// OpenFile opens one of check's files.
func (st *Store) OpenFile(check, p string) (io.ReadSeekCloser, File, error) {
	st.mu.Lock()
	r, ok := st.runs[check]
	st.mu.Unlock()
	if !ok {
		return nil, File{}, ErrNotFound
	}
	r.op.Lock()
	defer r.op.Unlock()
	for _, f := range r.files {
		if f.Path == p {
			fh, err := os.Open(filepath.Join(r.dir, "files", f.Name))
			if err != nil {
				return nil, File{}, err
			}
			return fh, File{Path: f.Path, Size: f.Size}, nil
		}
	}
	return nil, File{}, ErrNotFound
}
