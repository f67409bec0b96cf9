package termsafe

import (
	"io"
	"unicode/utf8"
)

// maxSGR bounds a colour sequence held back until it ends; a longer one
// is dropped.
const maxSGR = 128

// Writer filters bytes for a terminal: a log written by a stranger is
// shown as text and colours, and nothing else of it reaches the
// terminal. What passes:
//
//   - text (UTF-8), tabs and newlines ("\n", and "\r\n" written as "\n");
//   - SGR sequences, ESC [ digits and ';' m: colours and bold.
//
// What does not:
//
//   - a carriage return alone becomes a newline (it would move back over
//     the line and let later text hide what was written: a progress bar
//     is then one line per update);
//   - every other escape sequence is dropped whole: ESC [ … other than
//     SGR (cursor moves, clearing the screen, private modes), OSC (ESC ],
//     the window title, the clipboard with 52, hyperlinks), DCS, SOS, PM
//     and APC (ESC P, X, ^, _) up to their terminator (BEL or ESC \),
//     and two- or three-byte ones (ESC c resets the terminal);
//   - the other C0 controls (BEL, backspace, …), DEL, and the C1 controls
//     (U+0080–U+009F, 8-bit CSI and OSC among them) are dropped;
//   - a byte that is not UTF-8 becomes U+FFFD.
//
// A string sequence (OSC, DCS, …) also ends at a newline, which is kept:
// one left open hides the rest of its line, not the rest of the log. The
// bidi controls pass: in a log they reorder only the text of the line
// they are on, which the log's writer wrote anyway.
//
// A sequence or a UTF-8 character split across writes is held back
// (at most maxSGR bytes of a colour, 3 of a character) until a later
// write completes it; Flush ends the stream. A Writer is not safe for
// concurrent use.
type Writer struct {
	out   io.Writer
	state state
	sgr   []byte // the colour sequence held back, from its ESC; nil once it cannot be one
	cr    bool   // the last byte was a carriage return, written as "\n"
	part  []byte // an unfinished UTF-8 character
	buf   []byte // what a Write writes
}

type state uint8

const (
	ground   state = iota
	esc            // after ESC
	escInter       // ESC and intermediate bytes, waiting for the final byte
	csi            // ESC [ …
	str            // the body of OSC, DCS, SOS, PM or APC
)

// NewWriter returns a Writer to out.
func NewWriter(out io.Writer) *Writer { return &Writer{out: out} }

// Write filters p to the underlying writer. It returns len(p) unless
// that writer fails; the Writer is then not to be used again.
func (w *Writer) Write(p []byte) (int, error) {
	n := len(p)
	if len(w.part) > 0 {
		p = append(w.part, p...)
		w.part = nil
	}
	w.buf = w.buf[:0]
	for i := 0; i < len(p); {
		if p[i] < utf8.RuneSelf {
			w.rune(rune(p[i]), false)
			i++
			continue
		}
		if !utf8.FullRune(p[i:]) {
			w.part = append([]byte(nil), p[i:]...)
			break
		}
		r, size := utf8.DecodeRune(p[i:])
		w.rune(r, r == utf8.RuneError && size == 1)
		i += size
	}
	if len(w.buf) > 0 {
		if _, err := w.out.Write(w.buf); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// Flush ends the stream: an unfinished character is written as U+FFFD,
// and a sequence left unfinished is dropped.
func (w *Writer) Flush() error {
	w.buf = w.buf[:0]
	if len(w.part) > 0 && w.state == ground {
		w.buf = utf8.AppendRune(w.buf, utf8.RuneError)
	}
	w.part, w.sgr, w.state, w.cr = nil, nil, ground, false
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.out.Write(w.buf)
	return err
}

// rune steps the filter over r; invalid says r stands for a byte that is
// not UTF-8.
func (w *Writer) rune(r rune, invalid bool) {
	switch {
	case r == 0x1b: // ESC: a new sequence, from anywhere
		w.state, w.sgr, w.cr = esc, append(w.sgr[:0], 0x1b), false
		return
	case r == 0x18, r == 0x1a: // CAN, SUB: cancel a sequence
		w.state, w.cr = ground, false
		return
	}
	switch w.state {
	case esc:
		switch {
		case r == '[':
			w.state, w.sgr = csi, append(w.sgr, '[')
		case r == ']', r == 'P', r == 'X', r == '^', r == '_':
			w.state = str
		case r >= 0x20 && r <= 0x2f:
			w.state = escInter
		case r >= 0x30 && r <= 0x7e:
			w.state = ground // a two-byte sequence (ESC c, ESC 7, ESC \, …): dropped
		default:
			w.state = ground // not a sequence: r is text or a control
			w.ground(r, invalid)
		}
	case escInter:
		switch {
		case r >= 0x20 && r <= 0x2f:
		case r >= 0x30 && r <= 0x7e:
			w.state = ground
		default:
			w.state = ground
			w.ground(r, invalid)
		}
	case csi:
		switch {
		case r >= '0' && r <= '9', r == ';':
			if w.sgr != nil && len(w.sgr) < maxSGR {
				w.sgr = append(w.sgr, byte(r))
			} else {
				w.sgr = nil
			}
		case r >= 0x20 && r <= 0x3f: // other parameters, intermediates: not a colour
			w.sgr = nil
		case r >= 0x40 && r <= 0x7e: // the final byte
			if r == 'm' && w.sgr != nil {
				w.buf = append(append(w.buf, w.sgr...), 'm')
			}
			w.state = ground
		default:
			w.state = ground
			w.ground(r, invalid)
		}
	case str:
		switch r {
		case 0x07: // BEL ends it (ESC \ is an escape sequence of its own)
			w.state = ground
		case '\n':
			w.state = ground
			w.ground(r, invalid)
		}
	default:
		w.ground(r, invalid)
	}
}

// ground writes r, outside any sequence.
func (w *Writer) ground(r rune, invalid bool) {
	cr := w.cr
	w.cr = false
	switch {
	case invalid:
		w.buf = utf8.AppendRune(w.buf, utf8.RuneError)
	case r == '\n':
		if !cr {
			w.buf = append(w.buf, '\n')
		}
	case r == '\r':
		w.buf = append(w.buf, '\n')
		w.cr = true
	case r == '\t':
		w.buf = append(w.buf, '\t')
	case r < 0x20, r == 0x7f, isC1(r):
	default:
		w.buf = utf8.AppendRune(w.buf, r)
	}
}
