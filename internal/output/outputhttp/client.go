package outputhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/gorilla/websocket"

	"knotless.dev/run/internal/output"
)

// Client reads run output from a runner's listener or an output service.
type Client struct {
	// Base is the host's base URL (the methods are under /xrpc/).
	Base string
	HTTP *http.Client
	// Dialer dials the subscription (websocket.DefaultDialer when nil).
	Dialer *websocket.Dialer
}

// Error is an XRPC error the host answered with.
type Error struct {
	Status  int // HTTP status; 0 for an error frame of a subscription
	Name    string
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Name
	}
	return e.Name + ": " + e.Message
}

// IsError reports whether err is an XRPC error named name.
func IsError(err error, name string) bool {
	var e *Error
	return errors.As(err, &e) && e.Name == name
}

func (c *Client) url(method string, params url.Values) string {
	return strings.TrimSuffix(c.Base, "/") + "/xrpc/" + method + "?" + params.Encode()
}

// Get reads at most limit bytes of check's output from offset.
func (c *Client) Get(ctx context.Context, check string, offset int64, limit int) (*output.GetOutput, error) {
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	q := url.Values{"check": {check}, "offset": {strconv.FormatInt(offset, 10)}, "limit": {strconv.Itoa(limit)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(output.MethodGet, q), nil)
	if err != nil {
		return nil, fmt.Errorf("get output of %s: %w", check, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get output of %s: %w", check, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get output of %s: %w", check, responseError(resp))
	}
	var out output.GetOutput
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&out); err != nil {
		return nil, fmt.Errorf("get output of %s: decode: %w", check, err)
	}
	return &out, nil
}

// ReadError reads the XRPC error of a response that is not a success.
func ReadError(resp *http.Response) error { return responseError(resp) }

// responseError reads an XRPC error body.
func responseError(resp *http.Response) error {
	var body struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &body) != nil || body.Error == "" {
		return &Error{Status: resp.StatusCode, Name: http.StatusText(resp.StatusCode), Message: strings.TrimSpace(string(b))}
	}
	return &Error{Status: resp.StatusCode, Name: body.Error, Message: body.Message}
}

// MaxFrame is the most bytes of one subscription frame a Client reads:
// a #chunk of at most MaxChunkMax bytes with at most MaxFrameMarks
// marks is well within it.
const MaxFrame = 4 << 20

// Event is one frame of a subscription: exactly one field is set.
type Event struct {
	// Run names the run whose bytes follow: first on every connection,
	// and again when a new run of the check replaced the stream (its
	// bytes start at offset 0).
	Run   *output.RunFrame
	Chunk *output.Chunk
	Gap   *output.Gap
	End   *output.End
}

// Subscribe follows check's output from cursor, calling fn with each
// frame, until the stream's end (nil), fn's error, an error frame (an
// *Error), or the connection's end.
func (c *Client) Subscribe(ctx context.Context, check string, cursor int64, fn func(Event) error) error {
	return c.Resume(ctx, check, "", cursor, fn)
}

// Resume is Subscribe from cursor of run: when the check's stream is
// another run's now, the host sends that run's #run and its bytes from
// offset 0.
func (c *Client) Resume(ctx context.Context, check, run string, cursor int64, fn func(Event) error) error {
	d := c.Dialer
	if d == nil {
		d = websocket.DefaultDialer
	}
	q := url.Values{"check": {check}, "cursor": {strconv.FormatInt(cursor, 10)}}
	if run != "" {
		q.Set("run", run)
	}
	u := c.url(output.MethodSubscribe, q)
	u = "ws" + strings.TrimPrefix(u, "http")
	conn, resp, err := d.DialContext(ctx, u, nil)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			return fmt.Errorf("subscribe to %s: %w", check, responseError(resp))
		}
		return fmt.Errorf("subscribe to %s: %w", check, err)
	}
	defer conn.Close()
	// A host is whoever a check's live.service names: a frame larger
	// than any a host of ours sends ends the subscription before it is
	// read.
	conn.SetReadLimit(MaxFrame)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	for {
		_, b, err := conn.ReadMessage()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("subscribe to %s: %w", check, err)
		}
		ev, err := DecodeFrame(b)
		if err != nil {
			return fmt.Errorf("subscribe to %s: %w", check, err)
		}
		if ev == (Event{}) {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
		if ev.End != nil {
			return nil
		}
	}
}

// DecodeFrame decodes one event-stream frame; an error frame is
// returned as an *Error.
func DecodeFrame(b []byte) (Event, error) {
	r := bytes.NewReader(b)
	var h output.FrameHeader
	if err := h.UnmarshalCBOR(r); err != nil {
		return Event{}, fmt.Errorf("frame header: %w", err)
	}
	if h.Op == output.OpError {
		var e output.ErrorFrame
		if err := e.UnmarshalCBOR(r); err != nil {
			return Event{}, fmt.Errorf("error frame: %w", err)
		}
		return Event{}, &Error{Name: e.Error, Message: e.Message}
	}
	if h.Op != output.OpMessage {
		return Event{}, fmt.Errorf("frame op %d", h.Op)
	}
	var ev Event
	var err error
	switch h.T {
	case output.FrameRun:
		ev.Run = &output.RunFrame{}
		err = ev.Run.UnmarshalCBOR(r)
	case output.FrameChunk:
		ev.Chunk = &output.Chunk{}
		err = ev.Chunk.UnmarshalCBOR(r)
	case output.FrameGap:
		ev.Gap = &output.Gap{}
		err = ev.Gap.UnmarshalCBOR(r)
	case output.FrameEnd:
		ev.End = &output.End{}
		err = ev.End.UnmarshalCBOR(r)
	default:
		// A type this client does not know: skipped, as the event-stream
		// rules ask.
		return Event{}, nil
	}
	if err != nil {
		return Event{}, fmt.Errorf("%s frame: %w", h.T, err)
	}
	return ev, nil
}
