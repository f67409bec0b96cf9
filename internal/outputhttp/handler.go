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
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
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
}

// MaxGetLimit is the most bytes one getRunOutput returns.
const MaxGetLimit = 1 << 20

// Handler serves the output routes: /xrpc/dev.knotless.getRunOutput,
// /xrpc/dev.knotless.subscribeRunOutput, /xrpc/dev.knotless.getRunFile
// and /runs/{did}/{key}.
type Handler struct {
	cfg  Config
	page *page
	up   websocket.Upgrader
	mux  *http.ServeMux
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
	h := &Handler{cfg: cfg, page: p, up: websocket.Upgrader{
		ReadBufferSize:  1024,
		WriteBufferSize: 16 << 10,
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
	s, ok := h.cfg.Source.Stream(check)
	if !ok {
		XRPCError(w, http.StatusNotFound, "RunNotFound", "no output of "+check+" is kept here")
		return
	}
	rd, err := s.Read(off, int(limit))
	if err != nil {
		h.cfg.Logger.Error("read run output", "check", check, "err", err)
		XRPCError(w, http.StatusInternalServerError, "InternalServerError", "reading the output failed")
		return
	}
	out := output.GetOutput{
		Check: check, Run: s.Run(), Offset: rd.Offset, Data: atdata.Bytes(rd.Data),
		Size: rd.Size, Final: rd.Final, Status: rd.Status, Marks: output.ToWire(rd.Marks),
	}
	if out.Data == nil {
		out.Data = atdata.Bytes{}
	}
	if h.cfg.Files != nil {
		out.Files = h.cfg.Files.Files(check)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	// Public, without credentials: a page of any origin may read it.
	w.Header().Set("Access-Control-Allow-Origin", "*")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		h.cfg.Logger.Debug("write run output", "check", check, "err", err)
	}
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
	http.ServeContent(w, r, "", time.Time{}, f)
}

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
	conn, err := h.up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	ctx, cancel := context.WithCancel(r.Context())
	// The reader: control frames, and the end of the connection.
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
	defer func() {
		cancel()
		conn.Close()
		<-done
	}()
	fail := func(name, msg string) {
		h.writeError(conn, name, msg)
	}
	if cerr != nil {
		fail("InvalidRequest", cerr.Error())
		return
	}
	s, ok := h.cfg.Source.Stream(check)
	if !ok {
		fail("RunNotFound", "no output of "+check+" is kept here")
		return
	}
	signal, stop, err := s.Watch()
	if err != nil {
		fail("TooManySubscribers", err.Error())
		return
	}
	defer func() { stop() }()
	if followed != "" && followed != s.Run() {
		cursor = 0 // another run's stream: from its start
	}
	if size := s.Size(); cursor > size {
		fail("FutureCursor", fmt.Sprintf("cursor %d is past the stream's %d bytes", cursor, size))
		return
	}
	if h.write(conn, output.FrameRun, &output.RunFrame{Run: s.Run()}) != nil {
		return
	}
	ping := time.NewTicker(h.cfg.PingEvery)
	defer ping.Stop()
	off := cursor
	for {
		rd, err := s.Read(off, h.cfg.ChunkMax)
		if err != nil {
			h.cfg.Logger.Error("read run output", "check", check, "err", err)
			fail("InternalServerError", "reading the output failed")
			return
		}
		if rd.Offset > off {
			if h.write(conn, output.FrameGap, &output.Gap{Offset: off, Next: rd.Offset}) != nil {
				return
			}
			off = rd.Offset
		}
		if len(rd.Data) > 0 {
			if h.write(conn, output.FrameChunk, &output.Chunk{Offset: rd.Offset, Data: rd.Data, Marks: output.ToWire(rd.Marks)}) != nil {
				return
			}
			off = rd.Offset + int64(len(rd.Data))
			continue
		}
		if rd.Final {
			// A stream ended without a status was cut short: replaced by
			// a new run of the check, followed from its start.
			if next, ok := h.cfg.Source.Stream(check); ok && rd.Status == "" && next != s && next.Run() != s.Run() {
				nsig, nstop, err := next.Watch()
				if err != nil {
					fail("TooManySubscribers", err.Error())
					return
				}
				stop()
				s, signal, stop, off = next, nsig, nstop, 0
				if h.write(conn, output.FrameRun, &output.RunFrame{Run: s.Run()}) != nil {
					return
				}
				continue
			}
			if h.write(conn, output.FrameEnd, &output.End{Size: rd.Size, Status: rd.Status}) == nil {
				_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			}
			return
		}
		select {
		case <-signal:
		case <-ctx.Done():
			return
		case <-ping.C:
			if conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(h.cfg.WriteTimeout)) != nil {
				return
			}
		}
	}
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
