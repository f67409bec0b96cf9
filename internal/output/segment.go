package output

import (
	"fmt"
	"io"
	"os"
)

// segment is where a stream keeps a region of its bytes (its head, or
// its tail as a ring): in memory, or in a file.
type segment interface {
	WriteAt(p []byte, off int64) error
	ReadAt(p []byte, off int64) error
}

// memSegment grows as it is written, never past limit bytes.
type memSegment struct {
	b     []byte
	limit int64
}

func (m *memSegment) WriteAt(p []byte, off int64) error {
	if end := off + int64(len(p)); end > int64(len(m.b)) {
		if end > m.limit {
			return fmt.Errorf("write past the segment's %d bytes", m.limit)
		}
		if end > int64(cap(m.b)) {
			nb := make([]byte, end, min(max(end, 2*int64(cap(m.b))), m.limit))
			copy(nb, m.b)
			m.b = nb
		}
		m.b = m.b[:end]
	}
	copy(m.b[off:], p)
	return nil
}

func (m *memSegment) ReadAt(p []byte, off int64) error {
	if off+int64(len(p)) > int64(len(m.b)) {
		return io.ErrUnexpectedEOF
	}
	copy(p, m.b[off:])
	return nil
}

// fileSegment is a file, opened for each access: a service keeps many
// runs and holds no descriptor for any.
type fileSegment struct{ path string }

func (f fileSegment) WriteAt(p []byte, off int64) error {
	fh, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, werr := fh.WriteAt(p, off)
	if cerr := fh.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

func (f fileSegment) ReadAt(p []byte, off int64) error {
	fh, err := os.Open(f.path)
	if err != nil {
		return err
	}
	defer fh.Close()
	if _, err := fh.ReadAt(p, off); err != nil {
		return fmt.Errorf("read %s at %d: %w", f.path, off, err)
	}
	return nil
}
