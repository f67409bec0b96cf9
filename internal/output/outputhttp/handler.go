// Package outputhttp serves runs' output streams over HTTP: the XRPC
// queries dev.knotless.getRunOutput and dev.knotless.getRunFile, the
// subscription dev.knotless.subscribeRunOutput (a WebSocket with the
// atproto event-stream framing, resumable by byte offset), and the page
// /runs/DID/KEY that follows a check's output in a browser. It reads
// from a Source, so a runner's listener (its in-memory hub) and an
// output service (its store) mount the same handlers. Client reads them.
package outputhttp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/gorilla/websocket"
	cbg "github.com/whyrusleeping/cbor-gen"

	"knotless.dev/run/internal/output"
)

// Source is where the handlers find a check's stream (an output.Hub, an
// output.Store).
type Source interface {
	Stream(check string) (*output.Stream, bool)
}

// FileSource is where the handlers find a run's output files; a Source
// without it serves none.
type FileSource interface {
	Files(check string) []output.File
	OpenFile(check, path string) (io.ReadSeekCloser, output.File, error)
}

// Config configures the handlers.
type Config struct {
	Source Source
	// Files, when set, serves the runs' files (getRunFile, and the
	// files of getRunOutput).
	Files  FileSource
	Logger *slog.Logger
	// ChunkMax is the most bytes of one #chunk frame (default 64 KiB).
	ChunkMax int
	// WriteTimeout drops a subscriber that takes longer to take one
	// frame (default 30s); it may come back with its cursor.
	WriteTimeout time.Duration
	// PingEvery is how often an idle subscription is pinged (default
	// 30s).
	PingEvery time.Duration
	// MaxAnswers bounds the getRunOutput and getRunFile answers being
	// written at once, all readers together (default 256); past it a
	// request is refused at once (503 Busy), never queued. An answer is
	// written in small pieces, each within WriteTimeout, so one holds
	// little memory however slowly it is read.
	MaxAnswers int
	// MaxPerClient bounds what one client address has at once: answers
	// being written and subscriptions together (default 64); past it a
	// request is refused (429 TooManyRequests).
	MaxPerClient int
	// ClientAddr names a request's client for MaxPerClient (default
	// ClientAddr).
	ClientAddr func(*http.Request) string
}

// MaxGetLimit is the most bytes one getRunOutput returns.
const MaxGetLimit = 1 << 20

// MaxChunkMax is the most Config.ChunkMax may be: with MaxFrameMarks
// marks of at most output.MaxMarkName bytes each, a frame stays well
// within what a Client reads (MaxFrame).
const MaxChunkMax = 1 << 20

// MaxFrameMarks is the most marks one #chunk frame or getRunOutput
// answer carries: its bytes end before the next mark.
const MaxFrameMarks = 1024

// getPiece is how many bytes of the stream a getRunOutput answer reads
// and writes at a time.
const getPiece = 16 << 10

// Handler serves the output routes: /xrpc/dev.knotless.getRunOutput,
// /xrpc/dev.knotless.subscribeRunOutput, /xrpc/dev.knotless.getRunFile
// and /runs/{did}/{key}.
type Handler struct {
	cfg  Config
	page *page
	up   websocket.Upgrader
	mux  *http.ServeMux
	lim  *limiter
}

// New returns the handlers of cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Source == nil {
		return nil, errors.New("output handlers: no source")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ChunkMax <= 0 {
		cfg.ChunkMax = 64 << 10
	}
	cfg.ChunkMax = min(cfg.ChunkMax, MaxChunkMax)
	if cfg.MaxAnswers <= 0 {
		cfg.MaxAnswers = 256
	}
	if cfg.MaxPerClient <= 0 {
		cfg.MaxPerClient = 64
	}
	if cfg.ClientAddr == nil {
		cfg.ClientAddr = ClientAddr
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.PingEvery <= 0 {
		cfg.PingEvery = 30 * time.Second
	}
	p, err := newPage()
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, page: p, lim: newLimiter(cfg.MaxAnswers, cfg.MaxPerClient), up: websocket.Upgrader{
		ReadBufferSize:  1024,
		WriteBufferSize: 16 << 10,
		// A subscription waiting for bytes holds no write buffer.
		WriteBufferPool: &sync.Pool{},
		// The output is public and the stream takes no credentials: a
		// page of any origin may follow it.
		CheckOrigin: func(*http.Request) bool { return true },
	}}
	h.mux = http.NewServeMux()
	h.Register(h.mux)
	return h, nil
}

// Register adds the routes to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /xrpc/"+output.MethodGet, h.get)
	mux.HandleFunc("GET /xrpc/"+output.MethodSubscribe, h.subscribe)
	mux.HandleFunc("GET /xrpc/"+output.MethodGetFile, h.getFile)
	mux.HandleFunc("GET /runs/{did}/{key}", h.servePage)
}

// ServeHTTP serves the routes alone.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// XRPCError writes an XRPC error body.
func XRPCError(w http.ResponseWriter, status int, name, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": name, "message": message})
}

// checkParam reads the check parameter: a dev.knotless.check AT-URI.
func checkParam(r *http.Request) (string, error) {
	v := r.URL.Query().Get("check")
	if v == "" {
		return "", errors.New("check is required")
	}
	uri, err := syntax.ParseATURI(v)
	if err != nil {
		return "", fmt.Errorf("check %q: %w", v, err)
	}
	if _, err := uri.Authority().AsDID(); err != nil || uri.Collection().String() != "dev.knotless.check" || uri.RecordKey() == "" {
		return "", fmt.Errorf("check %q: not a dev.knotless.check record of a DID", v)
	}
	return uri.String(), nil
}

// intParam reads a non-negative integer parameter, def when absent.
func intParam(r *http.Request, name string, def, limit int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > limit {
		return 0, fmt.Errorf("%s %q: want an integer from 0 to %d", name, v, limit)
	}
	return n, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	check, err := checkParam(r)
	if err != nil {
		XRPCError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
		return
	}
	off, err := intParam(r, "offset", 0, 1<<62)
	if err != nil {
		XRPCError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
		return
	}
	limit, err := intParam(r, "limit", 64<<10, MaxGetLimit)
	if err != nil {
		XRPCError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
		return
	}
	release, ok := h.admit(w, r, true)
	if !ok {
		return
	}
	defer release()
	s, ok := h.cfg.Source.Stream(check)
	if !ok {
		XRPCError(w, http.StatusNotFound, "RunNotFound", "no output of "+check+" is kept here")
		return
	}
	h.writeOutput(w, check, s, off, int(limit))
}

// writeOutput writes the getRunOutput answer (output.GetOutput, as
// encoding/json writes it) of at most limit bytes of s from off, a
// piece at a time: the JSON around the bytes by hand, the bytes read
// getPiece at a time and written as base64 straight to w, the marks a
// batch at a time. A reader that does not read holds one piece, and is
// dropped when a write takes longer than WriteTimeout. The answer is
// the stream as its first read saw it (its size and end); a piece the
// run overwrote meanwhile (a stream keeps its last bytes in a ring) ends
// the bytes early, and the reader's next read hears of the cut.
func (h *Handler) writeOutput(w http.ResponseWriter, check string, s *output.Stream, off int64, limit int) {
	rd, err := s.Read(off, min(limit, getPiece))
	if err != nil {
		h.cfg.Logger.Error("read run output", "check", check, "err", err)
		XRPCError(w, http.StatusInternalServerError, "InternalServerError", "reading the output failed")
		return
	}
	var files []output.File
	if h.cfg.Files != nil {
		files = h.cfg.Files.Files(check)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	// Public, without credentials: a page of any origin may read it.
	w.Header().Set("Access-Control-Allow-Origin", "*")
	out := &jsonWriter{w: h.progress(w)}
	start, size, final, status := rd.Offset, rd.Size, rd.Final, rd.Status
	end := start + max(0, min(int64(limit), size-start))
	out.put(`{"check":`, check, `,"run":`, s.Run(), `,"offset":`, start, `,"data":{"$bytes":"`)
	b64 := base64.NewEncoder(base64.RawStdEncoding, out)
	pos, marks := start, 0
	for pos < end && out.err == nil {
		data := rd.Data[:min(int64(len(rd.Data)), end-pos)]
		n := 0
		for _, m := range rd.Marks {
			if m.Offset < pos+int64(len(data)) {
				n++
			}
		}
		// At most MaxFrameMarks marks: the bytes end before the next.
		if marks+n > MaxFrameMarks {
			if cut := rd.Marks[MaxFrameMarks-marks].Offset; cut > start {
				end = cut
				data = data[:cut-pos]
				n = sort.Search(len(rd.Marks), func(i int) bool { return rd.Marks[i].Offset >= cut })
			}
		}
		marks = min(marks+n, MaxFrameMarks)
		_, _ = b64.Write(data)
		pos += int64(len(data))
		if pos >= end {
			break
		}
		rd, err = s.Read(pos, int(min(getPiece, end-pos)))
		if err != nil {
			h.cfg.Logger.Error("read run output", "check", check, "err", err)
		}
		if err != nil || rd.Offset != pos || len(rd.Data) == 0 {
			end = pos // overwritten meanwhile: the answer ends here
		}
	}
	_ = b64.Close()
	out.put(`"},"size":`, size, `,"final":`, final)
	if status != "" {
		out.put(`,"status":`, status)
	}
	sep := `,"marks":[`
	for done := 0; done < marks && out.err == nil; {
		ms := s.Marks(start, pos, done, min(marks-done, 64))
		if len(ms) == 0 {
			break
		}
		for _, m := range output.ToWire(ms) {
			out.put(sep, m)
			sep = ","
		}
		done += len(ms)
	}
	if sep == "," {
		out.put("]")
	}
	if len(files) > 0 {
		out.put(`,"files":`, files)
	}
	out.put("}\n")
	if out.err == nil {
		// The answer leaves while it is counted (MaxAnswers).
		out.err = http.NewResponseController(w).Flush()
	}
	if out.err != nil {
		h.cfg.Logger.Debug("write run output", "check", check, "err", out.err)
	}
}

// jsonWriter writes an answer, keeping the first error: once a write
// failed, the others write nothing.
type jsonWriter struct {
	w   io.Writer
	err error
}

func (j *jsonWriter) Write(p []byte) (int, error) {
	if j.err != nil {
		return 0, j.err
	}
	n, err := j.w.Write(p)
	j.err = err
	return n, err
}

// put writes each part: the JSON between values (the string parts at
// even places) as it is, and each value as JSON.
func (j *jsonWriter) put(parts ...any) {
	for i, p := range parts {
		if lit, ok := p.(string); ok && i%2 == 0 {
			_, _ = io.WriteString(j, lit)
			continue
		}
		b, err := json.Marshal(p)
		if err != nil {
			j.err = cmp.Or(j.err, err)
			return
		}
		_, _ = j.Write(b)
	}
}

// progress is w whose every write must go out within WriteTimeout: a
// reader that stops reading is dropped, one that reads slowly is not
// (a large file takes its time).
func (h *Handler) progress(w http.ResponseWriter) io.Writer {
	return &progressWriter{w: w, rc: http.NewResponseController(w), timeout: h.cfg.WriteTimeout}
}

type progressWriter struct {
	w       io.Writer
	rc      *http.ResponseController
	timeout time.Duration
}

func (p *progressWriter) Write(b []byte) (int, error) {
	_ = p.rc.SetWriteDeadline(time.Now().Add(p.timeout))
	return p.w.Write(b)
}

func (h *Handler) getFile(w http.ResponseWriter, r *http.Request) {
	check, err := checkParam(r)
	if err != nil {
		XRPCError(w, http.StatusBadRequest, "InvalidRequest", err.Error())
		return
	}
	p := r.URL.Query().Get("path")
	if h.cfg.Files == nil {
		XRPCError(w, http.StatusNotFound, "FileNotFound", "no files are kept here")
		return
	}
	release, ok := h.admit(w, r, true)
	if !ok {
		return
	}
	defer release()
	f, info, err := h.cfg.Files.OpenFile(check, p)
	switch {
	case errors.Is(err, output.ErrNotFound):
		XRPCError(w, http.StatusNotFound, "FileNotFound", fmt.Sprintf("no file %q of %s is kept here", p, check))
		return
	case err != nil:
		h.cfg.Logger.Error("open run file", "check", check, "path", p, "err", err)
		XRPCError(w, http.StatusInternalServerError, "InternalServerError", "opening the file failed")
		return
	}
	defer f.Close()
	// A run's file is whatever its steps wrote: it is downloaded, never
	// rendered on this origin (where the page runs).
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(info.Path)}))
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; sandbox")
	http.ServeContent(progressResponse{w, h.progress(w)}, r, "", time.Time{}, f)
}

// progressResponse is a ResponseWriter whose body writes are those of
// progress.
type progressResponse struct {
	http.ResponseWriter
	body io.Writer
}

func (p progressResponse) Write(b []byte) (int, error) { return p.body.Write(b) }

// Unwrap is for http.ResponseController.
func (p progressResponse) Unwrap() http.ResponseWriter { return p.ResponseWriter }

// subscribe follows a stream over a WebSocket: #run naming the run,
// from the cursor a #gap for bytes not kept, #chunk frames, and #end
// once the stream has ended and the subscriber has all of it. The
// subscriber's pace is its own: it is told of new bytes by a signal that
// never waits, and reads them from its offset. A stream another run of
// the check replaced (its runner lost the run and runs the work again)
// goes on with the new run's #run and its bytes from offset 0, on the
// same connection or, for a subscriber that comes back naming the run
// it followed, on the next.
func (h *Handler) subscribe(w http.ResponseWriter, r *http.Request) {
	check, cerr := checkParam(r)
	var cursor int64
	if cerr == nil {
		cursor, cerr = intParam(r, "cursor", 0, 1<<62)
	}
	followed := r.URL.Query().Get("run")
	release, ok := h.admit(w, r, false)
	if !ok {
		return
	}
	defer release()
	conn, err := h.up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	ctx, hangUp := readControl(r.Context(), conn)
	defer hangUp()
	if cerr != nil {
		h.writeError(conn, "InvalidRequest", cerr.Error())
		return
	}
	wt, cursor, ok := h.watch(conn, check, cursor, followed)
	if !ok {
		return
	}
	defer func() { wt.stop() }()
	if h.write(conn, output.FrameRun, &output.RunFrame{Run: wt.s.Run()}) != nil {
		return
	}
	h.follow(ctx, conn, check, wt, cursor)
}

// readControl reads the subscriber's frames (control frames only) until
// the connection ends, which ends the returned context. hangUp closes
// the connection and waits for the reader.
func readControl(ctx context.Context, conn *websocket.Conn) (_ context.Context, hangUp func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		for {
			if _, _, err := conn.NextReader(); err != nil {
				return
			}
		}
	}()
	return ctx, func() {
		cancel()
		conn.Close()
		<-done
	}
}

// watched is the stream a subscriber follows, what signals that it
// grew, and the stop of that watch.
type watched struct {
	s      *output.Stream
	signal <-chan struct{}
	stop   func()
}

// watch finds the stream of check and watches it, and returns the
// cursor to follow it from: the one asked for, or 0 when the stream is
// of another run than the subscriber followed. A cursor past the end of
// a stream that goes on waits for it (follow): a run taken up after its
// runner died goes on from a checkpoint behind where its readers were,
// with the same bytes. It writes the error frame of what it refuses.
func (h *Handler) watch(conn *websocket.Conn, check string, cursor int64, followed string) (*watched, int64, bool) {
	s, ok := h.cfg.Source.Stream(check)
	if !ok {
		h.writeError(conn, "RunNotFound", "no output of "+check+" is kept here")
		return nil, 0, false
	}
	signal, stop, err := s.Watch()
	if err != nil {
		h.writeError(conn, "TooManySubscribers", err.Error())
		return nil, 0, false
	}
	if followed != "" && followed != s.Run() {
		cursor = 0 // another run's stream: from its start
	}
	if final, _ := s.Final(); final && cursor > s.Size() {
		h.futureCursor(conn, cursor, s.Size())
		stop()
		return nil, 0, false
	}
	return &watched{s: s, signal: signal, stop: stop}, cursor, true
}

// futureCursor refuses a cursor past the end of a stream that has ended.
func (h *Handler) futureCursor(conn *websocket.Conn, cursor, size int64) {
	h.writeError(conn, "FutureCursor", fmt.Sprintf("cursor %d is past the stream's %d bytes, and it has ended", cursor, size))
}

// follow sends the stream from off as #gap and #chunk frames, as it
// grows, until its #end (or the subscriber leaves), going on with a new
// run of the check that replaced it (nextRun); a ping keeps a quiet
// connection open.
func (h *Handler) follow(ctx context.Context, conn *websocket.Conn, check string, wt *watched, off int64) {
	ping := time.NewTicker(h.cfg.PingEvery)
	defer ping.Stop()
	for {
		rd, err := wt.s.Read(off, h.cfg.ChunkMax)
		if err != nil {
			h.cfg.Logger.Error("read run output", "check", check, "err", err)
			h.writeError(conn, "InternalServerError", "reading the output failed")
			return
		}
		if rd.Offset > off {
			if h.write(conn, output.FrameGap, &output.Gap{Offset: off, Next: rd.Offset}) != nil {
				return
			}
			off = rd.Offset
		}
		if len(rd.Data) > 0 {
			capMarks(&rd)
			if h.write(conn, output.FrameChunk, &output.Chunk{Offset: rd.Offset, Data: rd.Data, Marks: output.ToWire(rd.Marks)}) != nil {
				return
			}
			off = rd.Offset + int64(len(rd.Data))
			continue
		}
		if rd.Final {
			switched, ok := h.nextRun(conn, check, wt, rd)
			if !ok {
				return
			}
			if switched {
				off = 0
				continue
			}
			if off > rd.Size {
				// It ended short of the subscriber's cursor.
				h.futureCursor(conn, off, rd.Size)
				return
			}
			if h.write(conn, output.FrameEnd, &output.End{Size: rd.Size, Status: rd.Status}) == nil {
				_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			}
			return
		}
		select {
		case <-wt.signal:
		case <-ctx.Done():
			return
		case <-ping.C:
			if conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(h.cfg.WriteTimeout)) != nil {
				return
			}
		}
	}
}

// nextRun moves wt to a new run of check when rd, the end of wt's
// stream, says it was cut short (it ended without a status) and a new
// run's stream replaced it: its #run frame is written, and it is
// followed from its start. ok is false when the subscriber is to be
// left (an error frame written, or the connection gone).
func (h *Handler) nextRun(conn *websocket.Conn, check string, wt *watched, rd output.Read) (switched, ok bool) {
	next, found := h.cfg.Source.Stream(check)
	if !found || rd.Status != "" || next == wt.s || next.Run() == wt.s.Run() {
		return false, true
	}
	nsig, nstop, err := next.Watch()
	if err != nil {
		h.writeError(conn, "TooManySubscribers", err.Error())
		return false, false
	}
	wt.stop()
	wt.s, wt.signal, wt.stop = next, nsig, nstop
	if h.write(conn, output.FrameRun, &output.RunFrame{Run: wt.s.Run()}) != nil {
		return true, false
	}
	return true, true
}

// capMarks keeps at most MaxFrameMarks of rd's marks: its bytes end
// before the next one (unless they all are at its first byte).
func capMarks(rd *output.Read) {
	if len(rd.Marks) <= MaxFrameMarks {
		return
	}
	if cut := rd.Marks[MaxFrameMarks].Offset; cut > rd.Offset {
		rd.Data = rd.Data[:cut-rd.Offset]
		rd.Marks = rd.Marks[:sort.Search(len(rd.Marks), func(i int) bool { return rd.Marks[i].Offset >= cut })]
		return
	}
	rd.Marks = rd.Marks[:MaxFrameMarks]
}

// write sends one frame: the header {op: 1, t} and the body.
func (h *Handler) write(conn *websocket.Conn, t string, body cbg.CBORMarshaler) error {
	b, err := EncodeFrame(t, body)
	if err != nil {
		h.cfg.Logger.Error("encode frame", "t", t, "err", err)
		return err
	}
	_ = conn.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout))
	return conn.WriteMessage(websocket.BinaryMessage, b)
}

// writeError sends an error frame ({op: -1} and {error, message}) and
// closes.
func (h *Handler) writeError(conn *websocket.Conn, name, msg string) {
	var buf bytes.Buffer
	hdr := output.FrameHeader{Op: output.OpError}
	body := output.ErrorFrame{Error: name, Message: msg}
	if hdr.MarshalCBOR(&buf) != nil || body.MarshalCBOR(&buf) != nil {
		return
	}
	_ = conn.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout))
	if conn.WriteMessage(websocket.BinaryMessage, buf.Bytes()) == nil {
		_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.ClosePolicyViolation, name), time.Now().Add(time.Second))
	}
}

// EncodeFrame is one event-stream frame: the DAG-CBOR header {op: 1, t}
// followed by the DAG-CBOR body.
func EncodeFrame(t string, body cbg.CBORMarshaler) ([]byte, error) {
	var buf bytes.Buffer
	hdr := output.FrameHeader{Op: output.OpMessage, T: t}
	if err := hdr.MarshalCBOR(&buf); err != nil {
		return nil, err
	}
	if err := body.MarshalCBOR(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
