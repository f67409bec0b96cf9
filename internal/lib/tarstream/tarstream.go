// Package tarstream packs a directory into a tar stream and unpacks one
// into a directory. Unpacking assumes the stream is hostile: it comes out
// of a pod or container that ran someone else's code.
package tarstream

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Limits bound a transfer. A field zero or less means its default
// (DefaultMaxBytes, DefaultMaxFiles), never no bound: a caller that
// forgets the limits still cannot be made to fill the disk. A caller
// that means a bound no stream reaches says math.MaxInt64.
type Limits struct {
	// MaxBytes is the most tar bytes read or written.
	MaxBytes int64
	// MaxFiles is the most entries (files, directories, links) packed
	// or unpacked.
	MaxFiles int64
}

// The bounds of a Limits field left zero: the runner's largest default
// transfer bounds (--max-checkout, --max-files), so an executor left
// without limits of its own still takes every checkout the engine lets
// through by default.
const (
	DefaultMaxBytes int64 = 2 << 30
	DefaultMaxFiles int64 = 200_000
)

// Effective are the bounds lim applies: its fields, the defaults in
// place of those zero or less.
func (lim Limits) Effective() Limits {
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultMaxBytes
	}
	if lim.MaxFiles <= 0 {
		lim.MaxFiles = DefaultMaxFiles
	}
	return lim
}

// ErrTooLarge is returned when a stream passes Limits.MaxBytes.
var ErrTooLarge = errors.New("tar stream exceeds the size limit")

// ErrTooManyFiles is returned when a stream passes Limits.MaxFiles.
var ErrTooManyFiles = errors.New("tar stream exceeds the file count limit")

// countEntry counts one more entry against lim.MaxFiles (effective).
func countEntry(n *int64, lim Limits) error {
	*n++
	if *n > lim.MaxFiles {
		return fmt.Errorf("%w (%d files)", ErrTooManyFiles, lim.MaxFiles)
	}
	return nil
}

// Pack writes the tree under dir to w as a tar stream. Symbolic links are
// stored as links, not followed. The context bounds the time it takes.
func Pack(ctx context.Context, dir string, w io.Writer, lim Limits) error {
	p := NewPacker(ctx, w, lim)
	if err := p.Tree(dir, ""); err != nil {
		return err
	}
	return p.Close()
}

// Packer writes one tar stream of several trees and files, each named
// under a prefix of its own, within one set of Limits: what fills
// several directories of a session in one transfer.
type Packer struct {
	cw      *limitWriter
	tw      *tar.Writer
	lim     Limits
	entries int64
}

// NewPacker returns a Packer writing to w. The context bounds the time
// it takes; lim bounds the whole stream.
func NewPacker(ctx context.Context, w io.Writer, lim Limits) *Packer {
	lim = lim.Effective()
	cw := &limitWriter{ctx: ctx, w: w, max: lim.MaxBytes}
	return &Packer{cw: cw, tw: tar.NewWriter(cw), lim: lim}
}

// Tree adds the tree under dir, each entry named prefix/its path (its
// own path when prefix is empty); dir itself has no entry. Symbolic
// links are stored as links, not followed.
func (p *Packer) Tree(dir, prefix string) error {
	err := filepath.WalkDir(dir, func(fp string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, fp)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		if err := countEntry(&p.entries, p.lim); err != nil {
			return err
		}
		return packEntry(p.tw, fp, path.Join(prefix, filepath.ToSlash(rel)))
	})
	if err != nil {
		return fmt.Errorf("pack %s: %w", dir, err)
	}
	return nil
}

// File adds a regular file name holding body.
func (p *Packer) File(name string, mode fs.FileMode, body []byte) error {
	if err := countEntry(&p.entries, p.lim); err != nil {
		return err
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(mode.Perm()), Size: int64(len(body)), ModTime: time.Now()}
	if err := p.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	if _, err := p.tw.Write(body); err != nil {
		return fmt.Errorf("pack %s: %w", name, err)
	}
	return nil
}

// Close ends the stream.
func (p *Packer) Close() error {
	if err := p.tw.Close(); err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	return nil
}

func packEntry(tw *tar.Writer, p, name string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	var link string
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	case fi.IsDir(), fi.Mode().IsRegular():
	default:
		return fmt.Errorf("%s: unsupported file type %s", name, fi.Mode().Type())
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// Unpack reads a tar stream from r into dir, which must exist. It keeps
// permission bits, symbolic links and empty directories, and refuses
// absolute names, names with "..", links that point outside dir, and
// device or FIFO entries, with an error that names the entry. Nothing is
// ever written outside dir, also through links made by earlier entries.
//
// No link left in dir points outside it, also through a chain of links,
// whatever order the entries come in. Three rules make that hold:
//   - an entry's parent directories must be directories, not symbolic
//     links (made by earlier entries), so every entry lands where its
//     name says and a link's directory is a real one;
//   - a symbolic link's target may climb with ".." only at its start
//     and no higher than the link's own directory (CheckLinkTarget), so
//     every link resolves to an ancestor and then only descends;
//   - a hard link may not name a symbolic link: it would carry the
//     link's target to another depth.
//
// Every write goes through an os.Root, which refuses escapes on its own.
//
// A directory keeps its recorded permissions except that its owner may
// always read, write and search it (u+rwx is forced): a tree with a
// directory recorded as 0644 or 0000 is still unpacked fully and can be
// removed by the user who unpacked it, also when that user is not root.
func Unpack(ctx context.Context, r io.Reader, dir string, lim Limits) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("unpack into %s: %w", dir, err)
	}
	defer root.Close()
	lim = lim.Effective()
	tr := tar.NewReader(LimitReader(ctx, r, lim))
	type dirMode struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var dirs []dirMode
	var entries int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("unpack into %s: %w", dir, err)
		}
		name, err := CleanName(hdr.Name)
		if err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if name == "." {
			continue
		}
		if err := countEntry(&entries, lim); err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		if err := unpackEntry(root, tr, hdr, name, mode); err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirMode{name, mode | ownerDirBits, hdr.ModTime})
		}
	}
	// Directory modes last, so a read-only directory can still be filled.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if fi, err := root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue // replaced by a later entry; never chmod through a link
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return fmt.Errorf("tar entry %q: %w", d.name, err)
		}
		_ = root.Chtimes(d.name, d.mtime, d.mtime)
	}
	return nil
}

// ownerDirBits are the permissions an unpacked directory always gives its
// owner, so that the tree can be filled and removed without root.
const ownerDirBits fs.FileMode = 0o700

func unpackEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string, mode fs.FileMode) error {
	if err := makeParents(root, name); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
			return nil
		}
		if err := removeExisting(root, name); err != nil {
			return err
		}
		return root.Mkdir(name, 0o755)
	case tar.TypeReg:
		if err := removeExisting(root, name); err != nil {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		// The umask may have narrowed the mode at create.
		if err := root.Chmod(name, mode); err != nil {
			return err
		}
		return root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	case tar.TypeSymlink:
		if err := CheckLinkTarget(name, hdr.Linkname); err != nil {
			return err
		}
		if err := removeExisting(root, name); err != nil {
			return err
		}
		return root.Symlink(hdr.Linkname, name)
	case tar.TypeLink:
		target, err := CleanName(hdr.Linkname)
		if err != nil || target == "." {
			return fmt.Errorf("hard link to %q points outside the target", hdr.Linkname)
		}
		if fi, err := root.Lstat(target); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("hard link to %q names a symbolic link", hdr.Linkname)
		}
		if err := removeExisting(root, name); err != nil {
			return err
		}
		return root.Link(target, name)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("entry type %q not allowed (devices, FIFOs and others are refused)", string(hdr.Typeflag))
	}
}

// CleanName returns the entry name as a clean relative path, or an error
// for an absolute name or one that climbs with "..".
func CleanName(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty name")
	}
	if strings.HasPrefix(name, "/") || filepath.VolumeName(name) != "" {
		return "", errors.New("absolute path not allowed")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", errors.New("NUL in name")
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", errors.New(`".." not allowed`)
		}
	}
	return path.Clean(name), nil
}

// makeParents makes the parent directories of name that are missing and
// refuses a parent that is a symbolic link or not a directory: an entry
// lands where its name says, never where an earlier link points.
func makeParents(root *os.Root, name string) error {
	parts := strings.Split(name, "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/")
		fi, err := root.Lstat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := root.Mkdir(dir, 0o755|ownerDirBits); err != nil {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("parent %q is a symbolic link", dir)
		case !fi.IsDir():
			return fmt.Errorf("parent %q is not a directory", dir)
		}
	}
	return nil
}

// CheckLinkTarget refuses a symbolic link whose target, read relative to
// the link's own directory, leaves the tree. The target must be relative
// and may climb with ".." only before its first other part: a ".." after
// a part that may itself be a link would climb from wherever that link
// points, so lexical cleaning would not tell where the link ends up.
// With its leading ".." bounded by the link's depth, the link resolves
// to an ancestor of itself and then only descends, inside the tree.
func CheckLinkTarget(name, target string) error {
	if target == "" || strings.HasPrefix(target, "/") || strings.IndexByte(target, 0) >= 0 {
		return fmt.Errorf("symbolic link to %q points outside the target", target)
	}
	up, descended := 0, false
	for _, part := range strings.Split(target, "/") {
		switch part {
		case "", ".":
		case "..":
			if descended {
				return fmt.Errorf("symbolic link to %q climbs after descending", target)
			}
			up++
		default:
			descended = true
		}
	}
	depth := strings.Count(path.Clean(name), "/")
	if up > depth {
		return fmt.Errorf("symbolic link to %q points outside the target", target)
	}
	return nil
}

// removeExisting clears name unless it is absent, so a new entry never
// writes through a link or into a file an earlier entry made.
func removeExisting(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return root.RemoveAll(name)
	}
	return root.Remove(name)
}

// LimitReader bounds r by lim.MaxBytes (DefaultMaxBytes when zero) and
// stops at ctx's end: the reading side of every transfer.
func LimitReader(ctx context.Context, r io.Reader, lim Limits) io.Reader {
	return &limitReader{ctx: ctx, r: r, max: lim.Effective().MaxBytes}
}

type limitReader struct {
	ctx context.Context
	r   io.Reader
	n   int64
	max int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if err := l.ctx.Err(); err != nil {
		return 0, err
	}
	if l.n > l.max {
		return 0, fmt.Errorf("%w (%d bytes)", ErrTooLarge, l.max)
	}
	if room := l.max - l.n; int64(len(p)) > room {
		// Read at most one byte past the bound: enough to see it passed,
		// and nothing past it reaches the consumer. (room+1, not
		// max-n+1: a bound of math.MaxInt64 would overflow.)
		p = p[:room+1]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	if l.n > l.max {
		return n - int(l.n-l.max), fmt.Errorf("%w (%d bytes)", ErrTooLarge, l.max)
	}
	return n, err
}

type limitWriter struct {
	ctx context.Context
	w   io.Writer
	n   int64
	max int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if err := l.ctx.Err(); err != nil {
		return 0, err
	}
	if int64(len(p)) > l.max-l.n {
		return 0, fmt.Errorf("%w (%d bytes)", ErrTooLarge, l.max)
	}
	n, err := l.w.Write(p)
	l.n += int64(n)
	return n, err
}

// CountingReader counts the bytes read through it: a transfer's size for
// the logs.
type CountingReader struct {
	R io.Reader
	N int64
}

func (c *CountingReader) Read(p []byte) (int, error) {
	n, err := c.R.Read(p)
	c.N += int64(n)
	return n, err
}

// CountingWriter counts the bytes written through it.
type CountingWriter struct {
	W io.Writer
	N int64
}

func (c *CountingWriter) Write(p []byte) (int, error) {
	n, err := c.W.Write(p)
	c.N += int64(n)
	return n, err
}
