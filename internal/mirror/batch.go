package mirror

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
)

// batch is one `git cat-file --batch-command` of a mirror: several
// objects read, one request after another, by one process instead of
// one each. It runs as every git command does (the clean environment,
// its own process group, the git timeout), and reads no object larger
// than the caller allows.
type batch struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *capped
	cancel context.CancelFunc
	ctx    context.Context
	m      *Mirrors
	// broken is the error after which the process's answers can no
	// longer be told apart: every later request gets it.
	broken error
}

// errObjectMissing is a request for an object the mirror has not.
var errObjectMissing = errors.New("object missing")

// batch starts git cat-file --batch-command in r. close must be called.
func (r *Repo) batch(ctx context.Context) (*batch, error) {
	cmd, ctx, cancel := r.m.command(ctx, nil, nil, "--git-dir", r.Dir, "cat-file", "--batch-command")
	b := &batch{cmd: cmd, stderr: &capped{max: 64 << 10}, cancel: cancel, ctx: ctx, m: r.m}
	cmd.Stderr = b.stderr
	var err error
	if b.in, err = cmd.StdinPipe(); err != nil {
		cancel()
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	b.out = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("git cat-file: %w", err)
	}
	return b, nil
}

// close ends the process and waits for it: at the end of its input
// when every answer was read, killed when one was left unread (a
// process blocked writing it would not see the end of its input).
func (b *batch) close() {
	_ = b.in.Close()
	if b.broken != nil {
		b.cancel()
	}
	_ = b.cmd.Wait()
	b.cancel()
}

// header asks for obj with command (info or contents) and reads the
// answer's first line: the object's id, type and size, or
// errObjectMissing.
func (b *batch) header(command, obj string) (id, typ string, size int64, err error) {
	if b.broken != nil {
		return "", "", 0, b.broken
	}
	defer func() {
		if err != nil && !errors.Is(err, errObjectMissing) {
			b.broken = err
		}
	}()
	if strings.ContainsAny(obj, "\n\x00") {
		return "", "", 0, fmt.Errorf("git cat-file: object name %q", obj)
	}
	if _, err := io.WriteString(b.in, command+" "+obj+"\n"); err != nil {
		return "", "", 0, b.failed(err)
	}
	line, err := b.out.ReadString('\n')
	if err != nil {
		return "", "", 0, b.failed(err)
	}
	f := strings.Fields(line)
	switch {
	case len(f) == 2 && (f[1] == "missing" || f[1] == "ambiguous"):
		return "", "", 0, fmt.Errorf("%s: %w", obj, errObjectMissing)
	case len(f) != 3:
		return "", "", 0, fmt.Errorf("git cat-file: unexpected line %q", strings.TrimSpace(line))
	}
	if size, err = strconv.ParseInt(f[2], 10, 64); err != nil || size < 0 {
		return "", "", 0, fmt.Errorf("git cat-file: size in %q", strings.TrimSpace(line))
	}
	return f[0], f[1], size, nil
}

// info is the id, type and size of obj.
func (b *batch) info(obj string) (id, typ string, size int64, err error) {
	return b.header("info", obj)
}

// contents reads obj, of at most limit bytes: a larger one is an error,
// after which the batch answers nothing more (its content is not read).
func (b *batch) contents(obj string, limit int64) (id, typ string, data []byte, err error) {
	id, typ, size, err := b.header("contents", obj)
	if err != nil {
		return "", "", nil, err
	}
	defer func() {
		if err != nil {
			b.broken = err
		}
	}()
	if size > limit {
		return "", "", nil, fmt.Errorf("git cat-file: %s is %d bytes, over %d", obj, size, limit)
	}
	data = make([]byte, size+1) // and its closing newline
	if _, err := io.ReadFull(b.out, data); err != nil {
		return "", "", nil, b.failed(err)
	}
	if data[size] != '\n' {
		return "", "", nil, fmt.Errorf("git cat-file: %s: no newline after its %d bytes", obj, size)
	}
	return id, typ, data[:size], nil
}

// failed says why the process stopped answering.
func (b *batch) failed(err error) error {
	if err := b.m.stopped(b.ctx, "git cat-file"); err != nil {
		return err
	}
	if msg := strings.TrimSpace(b.stderr.String()); msg != "" {
		return fmt.Errorf("git cat-file: %w: %s", err, msg)
	}
	return fmt.Errorf("git cat-file: %w", err)
}

// treeEntry is one entry of a tree object.
type treeEntry struct {
	mode string
	name string
	id   string // hex
}

// blob reports whether the entry is a file's content (a regular file,
// executable or not, or a symbolic link: ls-tree's "blob").
func (e treeEntry) blob() bool {
	return strings.HasPrefix(e.mode, "10") || e.mode == "120000"
}

// parseTree reads a tree object's entries ("<mode> <name>\0<id>", the
// id raw, of idLen bytes).
func parseTree(data []byte, idLen int) ([]treeEntry, error) {
	var entries []treeEntry
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		nul := bytes.IndexByte(data, 0)
		if sp <= 0 || nul < sp+2 || len(data) < nul+1+idLen {
			return nil, errors.New("malformed tree object")
		}
		entries = append(entries, treeEntry{
			mode: string(data[:sp]),
			name: string(data[sp+1 : nul]),
			id:   hex.EncodeToString(data[nul+1 : nul+1+idLen]),
		})
		data = data[nul+1+idLen:]
	}
	return entries, nil
}
