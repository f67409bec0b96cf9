package output

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/bluesky-social/indigo/atproto/atdata"
)

//go:generate go run ./gen

// The run output methods (lexicons/dev/knotless).
const (
	MethodGet       = "dev.knotless.getRunOutput"
	MethodSubscribe = "dev.knotless.subscribeRunOutput"
	MethodPut       = "dev.knotless.putRunOutput"
	MethodPutFile   = "dev.knotless.putRunFile"
	MethodGetFile   = "dev.knotless.getRunFile"
)

// The subscribeRunOutput frame types (the header's t).
const (
	FrameChunk = "#chunk"
	FrameGap   = "#gap"
	FrameEnd   = "#end"
	FrameRun   = "#run"
)

// Frame header ops (atproto event streams).
const (
	OpMessage = 1
	OpError   = -1
)

// WireMark is a Mark as the lexicons have it (dev.knotless.defs#mark),
// in JSON and in DAG-CBOR.
type WireMark struct {
	Offset int64  `json:"offset" cborgen:"offset"`
	Time   string `json:"time" cborgen:"time"`
	Kind   string `json:"kind" cborgen:"kind"`
	Step   *int64 `json:"step,omitempty" cborgen:"step,omitempty"`
	Name   string `json:"name,omitempty" cborgen:"name,omitempty"`
	Status string `json:"status,omitempty" cborgen:"status,omitempty"`
}

// datetime is the atproto datetime form the marks' times are written in.
const datetime = "2006-01-02T15:04:05.000Z"

// MaxMarkName is the most bytes of a mark's step name on the wire (the
// lexicon's maxLength); a longer name is cut, so that a frame's marks
// stay small.
const MaxMarkName = 255

// clip cuts s to at most n bytes, not inside a UTF-8 character.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ToWire converts marks for the wire, their strings cut to the
// lexicon's lengths.
func ToWire(ms []Mark) []WireMark {
	if len(ms) == 0 {
		return nil
	}
	out := make([]WireMark, len(ms))
	for i, m := range ms {
		out[i] = WireMark{Offset: m.Offset, Time: m.Time.UTC().Format(datetime), Kind: clip(m.Kind, 32), Name: clip(m.Name, MaxMarkName), Status: clip(m.Status, 32)}
		if m.Step > 0 {
			step := int64(m.Step)
			out[i].Step = &step
		}
	}
	return out
}

// FromWire converts marks from the wire; a mark whose time does not
// parse is refused.
func FromWire(ws []WireMark) ([]Mark, error) {
	if len(ws) == 0 {
		return nil, nil
	}
	out := make([]Mark, len(ws))
	for i, w := range ws {
		t, err := time.Parse(time.RFC3339Nano, w.Time)
		if err != nil {
			return nil, fmt.Errorf("mark at %d: time %q: %w", w.Offset, w.Time, err)
		}
		out[i] = Mark{Offset: w.Offset, Time: t, Kind: w.Kind, Name: w.Name, Status: w.Status}
		if w.Step != nil {
			out[i].Step = int(*w.Step)
		}
	}
	return out, nil
}

// FrameHeader is the DAG-CBOR header of an event-stream frame: op 1 and
// the message type t, or op -1 for an error.
type FrameHeader struct {
	Op int64  `cborgen:"op"`
	T  string `cborgen:"t,omitempty"`
}

// ErrorFrame is the body of an error frame.
type ErrorFrame struct {
	Error   string `cborgen:"error"`
	Message string `cborgen:"message,omitempty"`
}

// Chunk is dev.knotless.subscribeRunOutput#chunk.
type Chunk struct {
	Offset int64      `cborgen:"offset"`
	Data   []byte     `cborgen:"data"`
	Marks  []WireMark `cborgen:"marks,omitempty"`
}

// Gap is dev.knotless.subscribeRunOutput#gap.
type Gap struct {
	Offset int64 `cborgen:"offset"`
	Next   int64 `cborgen:"next"`
}

// End is dev.knotless.subscribeRunOutput#end.
type End struct {
	Size   int64  `cborgen:"size"`
	Status string `cborgen:"status,omitempty"`
}

// RunFrame is dev.knotless.subscribeRunOutput#run: the run whose bytes
// follow. Every subscription begins with one; one in the middle says a
// new run of the check (a run again after its runner was lost) replaced
// the stream, which starts again at offset 0.
type RunFrame struct {
	Run string `cborgen:"run"`
}

// File is a run's output file (dev.knotless.defs#runFile).
type File struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// GetOutput is dev.knotless.getRunOutput#output.
type GetOutput struct {
	Check  string       `json:"check"`
	Run    string       `json:"run"`
	Offset int64        `json:"offset"`
	Data   atdata.Bytes `json:"data"`
	Size   int64        `json:"size"`
	Final  bool         `json:"final"`
	Status string       `json:"status,omitempty"`
	Marks  []WireMark   `json:"marks,omitempty"`
	Files  []File       `json:"files,omitempty"`
}

// PutInput is dev.knotless.putRunOutput#input.
type PutInput struct {
	Check   string       `json:"check"`
	Run     string       `json:"run"`
	Offset  int64        `json:"offset"`
	Data    atdata.Bytes `json:"data,omitempty"`
	CutFrom *int64       `json:"cutFrom,omitempty"`
	Marks   []WireMark   `json:"marks,omitempty"`
	Final   bool         `json:"final,omitempty"`
	Status  string       `json:"status,omitempty"`
}

// PutOutput is dev.knotless.putRunOutput#output.
type PutOutput struct {
	Size  int64 `json:"size"`
	Final bool  `json:"final"`
}
