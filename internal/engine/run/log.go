package run

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"knotless.dev/run/internal/engine/caplog"
	"knotless.dev/run/internal/lib/mask"
)

// resumeLog makes the log go on from the earlier process's: its kept
// bytes and, when they were cut in the middle, its size, so the cut
// marker of the final log counts every byte cut in either process.
func (r *runState) resumeLog(prior []byte, size int64) {
	if size > int64(len(prior)) {
		buf, err := caplog.Resume(caplog.DefaultMax, prior, size)
		if err == nil {
			r.buf = buf
			return
		}
		r.log.Warn("the handed-over log does not resume; it goes on as it was kept", "err", err)
	}
	_, _ = r.buf.Write(prior)
}

// openLog opens the run log: everything written to it is masked with
// the granted values, then kept (capped) and sent to Request.Live. The
// first process of a run also logs each secret an untrusted run is not
// granted.
func (r *runState) openLog(first bool) {
	sink := io.MultiWriter(&r.tail, r.buf)
	if r.req.Live != nil {
		sink = io.MultiWriter(&r.tail, r.buf, r.req.Live)
	}
	r.mask = mask.NewSet(r.grantedValues())
	r.out = r.mask.Writer(&r.lines)
	r.lines.w = sink
	if !r.req.Trusted && first {
		for _, name := range r.req.Workflow.Secrets {
			r.logf("knotless-run: secret %s withheld: untrusted run", name)
		}
	}
}

// mark tells a Live that takes step marks of the line logged next: what
// the log holds back is written first and an unended line ended, so the
// mark falls where that line begins.
func (r *runState) mark(f func(StepMarker)) {
	m, ok := r.req.Live.(StepMarker)
	if !ok {
		return
	}
	_ = r.out.Flush()
	r.lines.endLine()
	f(m)
}

// logf writes one line of the runner's own to the run log.
func (r *runState) logf(format string, args ...any) {
	r.lines.endLine()
	fmt.Fprintf(r.out, format+"\n", args...)
	_ = r.out.Flush()
}

// lineTracker remembers whether the log ends mid-line, so the runner's
// own lines always start on a line of their own.
type lineTracker struct {
	w       io.Writer
	midLine bool
}

func (l *lineTracker) Write(p []byte) (int, error) {
	if len(p) > 0 {
		l.midLine = p[len(p)-1] != '\n'
	}
	return l.w.Write(p)
}

func (l *lineTracker) endLine() {
	if l.midLine {
		_, _ = l.Write([]byte("\n"))
	}
}

// The tail of a step's output a StepError carries: its last tailLines
// lines, of at most tailBytes bytes.
const (
	tailLines = 10
	tailBytes = 2048
)

// tailBuffer keeps the last bytes of the masked log since its reset (a
// step's start): what a failing step's StepError says it printed last.
type tailBuffer struct {
	b   []byte
	cut bool // bytes before b were dropped
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - tailBytes; over > tailBytes {
		t.b = append(t.b[:0], t.b[over:]...)
		t.cut = true
	}
	return len(p), nil
}

func (t *tailBuffer) reset() { t.b, t.cut = t.b[:0], false }

// String is the last lines kept, without a line cut at their front.
func (t *tailBuffer) String() string {
	b, cut := t.b, t.cut
	if len(b) > tailBytes {
		b, cut = b[len(b)-tailBytes:], true
	}
	if i := bytes.IndexByte(b, '\n'); cut && i >= 0 && i < len(b)-1 {
		b = b[i+1:]
	}
	b = bytes.TrimRight(b, "\n")
	for i, n := len(b)-1, 0; i >= 0; i-- {
		if b[i] == '\n' {
			if n++; n == tailLines {
				b = b[i+1:]
				break
			}
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
