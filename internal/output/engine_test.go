package output_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/rules/workflow"
)

// all reads the whole stream from 0, cuts as "[cut N]".
func all(t *testing.T, s *output.Stream) string {
	t.Helper()
	b, _ := allMarks(t, s)
	return b
}

// allMarks reads the whole stream from 0 and its marks.
func allMarks(t *testing.T, s *output.Stream) (string, []output.Mark) {
	t.Helper()
	var b strings.Builder
	var marks []output.Mark
	off := int64(0)
	for {
		rd, err := s.Read(off, 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		if rd.Offset > off {
			fmt.Fprintf(&b, "[cut %d]", rd.Offset-off)
		}
		b.Write(rd.Data)
		marks = append(marks, rd.Marks...)
		off = rd.Offset + int64(len(rd.Data))
		if len(rd.Data) == 0 {
			return b.String(), marks
		}
	}
}

// The stream a run writes through Request.Live on the shell executor is
// its final log: the same bytes at the same offsets, and, when the log
// is capped, its head and tail with the cut marker joined as the blob
// has them; the step marks fall where the step lines begin.
func TestLiveIsTheFinalLog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		script string
		capped bool
	}{
		{"short", "echo one; printf 'no newline'", false},
		{"past the cap", "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo last line", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eng := run.New(run.Config{Executor: shell.New(shell.Config{Root: t.TempDir(), Path: os.Getenv("PATH")})}) // steps find their tools where the test does
			s := output.NewStream("at://did:plc:r/dev.knotless.check/k", "r1", output.RunnerLimits())
			res := eng.Run(context.Background(), run.Request{
				RunID: "r1",
				Workflow: &workflow.Workflow{Name: "w", Steps: []workflow.Step{
					{Name: "first", Run: tc.script}, {Name: "second", Run: "echo two"}}},
				Checkout: t.TempDir(),
				Live:     s,
			})
			if res.Status != run.Success {
				t.Fatalf("status %s: %s", res.Status, res.Error)
			}
			s.End(string(res.Status))
			log, err := s.Log()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(log, res.Log) || s.Size() != res.LogSize {
				t.Fatalf("stream log of %d bytes (size %d), final log of %d (size %d)", len(log), s.Size(), len(res.Log), res.LogSize)
			}
			got := all(t, s)
			if !tc.capped && got != string(res.Log) {
				t.Errorf("stream bytes differ from the final log:\n%s\n---\n%s", got, res.Log)
			}
			if tc.capped {
				if !bytes.Contains(res.Log, []byte("bytes cut from the middle")) || !strings.Contains(got, "[cut ") {
					t.Errorf("capped log: marker %v, stream cut %v", bytes.Contains(res.Log, []byte("bytes cut")), strings.Contains(got, "[cut "))
				}
				head, _, _ := strings.Cut(got, "[cut ")
				if !bytes.HasPrefix(res.Log, []byte(head)) || !strings.HasSuffix(got, "last line\n"+tailOf(string(res.Log), "last line\n")) {
					t.Error("the stream's head or tail is not the final log's")
				}
			}
			_, marks := allMarks(t, s)
			var starts []int64
			for _, m := range marks {
				if m.Kind == output.MarkStepStart {
					starts = append(starts, m.Offset)
				}
			}
			if len(starts) != 2 {
				t.Fatalf("step start marks at %v, want 2", starts)
			}
			for i, off := range starts {
				want := fmt.Sprintf("==> step %d/2: ", i+1)
				rd, _ := s.Read(off, len(want))
				if string(rd.Data) != want {
					t.Errorf("step %d's mark at %d is not where %q begins: %q", i+1, off, want, rd.Data)
				}
			}
		})
	}
}

// brief shortens a long log for a failure message.
func brief(s string) string {
	if len(s) <= 2000 {
		return s
	}
	return s[:1000] + fmt.Sprintf("\n[... %d bytes ...]\n", len(s)-2000) + s[len(s)-1000:]
}

func tailOf(s, after string) string {
	_, rest, _ := strings.Cut(s, after)
	return rest
}

// chunkExecutor runs steps whose output comes in the chunks given, each
// a Write of its own. A first session, at detachAt (step, chunks
// written), waits to be detached; a resumed session writes from the
// offset it is asked for to the end.
type chunkExecutor struct {
	steps    map[string][]string
	detachAt [2]int // step id (1-based), chunks written before waiting
	reached  chan struct{}
	once     sync.Once
}

func (e *chunkExecutor) Name() string { return "chunk" }
func (e *chunkExecutor) Start(context.Context, executor.Spec) (executor.Session, error) {
	return &chunkSession{e: e}, nil
}
func (e *chunkExecutor) Sweep(context.Context, []string) ([]executor.Ref, error) { return nil, nil }
func (e *chunkExecutor) Resume(context.Context, executor.Ref) (executor.Session, error) {
	return &chunkSession{e: e, resumed: true}, nil
}

type chunkSession struct {
	e       *chunkExecutor
	resumed bool
}

func (s *chunkSession) Ref() executor.Ref {
	return executor.Ref{Executor: "chunk", RunID: "r", Name: "s"}
}
func (s *chunkSession) Dirs() executor.Dirs {
	return executor.Dirs{Work: "/w", Steps: "/s", Outputs: "/o"}
}
func (s *chunkSession) Release()                                        {}
func (s *chunkSession) Stop(context.Context) error                      { return nil }
func (s *chunkSession) KillStep(context.Context, string) error          { return nil }
func (s *chunkSession) StartStep(context.Context, string, []byte) error { return nil }
func (s *chunkSession) Put(_ context.Context, _ string, r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	return err
}
func (s *chunkSession) Get(_ context.Context, _ string, w io.Writer) error {
	return tar.NewWriter(w).Close()
}
func (s *chunkSession) FollowStep(ctx context.Context, id string, offset int64, out io.Writer) (executor.Exit, error) {
	pos := int64(0)
	for i, c := range s.e.steps[id] {
		if !s.resumed && fmt.Sprint(s.e.detachAt[0]) == id && i == s.e.detachAt[1] {
			s.e.once.Do(func() { close(s.e.reached) })
			<-ctx.Done()
			return executor.Exit{}, ctx.Err()
		}
		end := pos + int64(len(c))
		if end > offset {
			if _, err := io.WriteString(out, c[max(0, offset-pos):]); err != nil {
				return executor.Exit{}, err
			}
		}
		pos = end
	}
	return executor.Exit{}, nil
}

// A secret printed split across two chunks, across two steps' output
// and across a handover never shows in either process's stream, and the
// successor's stream goes on from the offset its predecessor's ended at:
// together they are the final log, with no gap and no byte twice. Also
// when the log was cut in the middle before the handover.
func TestLiveMaskedAcrossChunksAndHandover(t *testing.T) {
	t.Parallel()
	const secret = "hunter2-SECRET"
	for _, big := range []bool{false, true} {
		t.Run(fmt.Sprintf("capped=%v", big), func(t *testing.T) {
			t.Parallel()
			first := []string{"a pw=hunter2", "-SECRET b\n", "c hunt"}
			if big {
				first = append([]string{strings.Repeat("y", 2_000_000) + "\n"}, first...)
			}
			ex := &chunkExecutor{
				steps: map[string][]string{
					"1": first,
					"2": {"d ter2-SECRET\n", "e hunter2-SE", "CRET f\n", "g hunter"},
					"3": {"2-SECRET h\n"},
				},
				detachAt: [2]int{2, 2}, // after "e hunter2-SE"
				reached:  make(chan struct{}),
			}
			eng := run.New(run.Config{Executor: ex})
			detach := make(chan struct{})
			req := run.Request{
				RunID: "r",
				Workflow: &workflow.Workflow{Name: "w", Secrets: []string{"PW"}, Steps: []workflow.Step{
					{Name: "one", Run: "x", Secrets: []string{"PW"}}, {Name: "two", Run: "x"}, {Name: "three", Run: "x"}}},
				Checkout: t.TempDir(),
				Secrets:  map[string]string{"PW": secret},
				Trusted:  true,
				Detach:   detach,
			}
			s1 := output.NewStream("c", "r", output.RunnerLimits())
			req.Live = s1
			go func() { <-ex.reached; close(detach) }()
			res1 := eng.Run(context.Background(), req)
			if res1.Status != run.Detached || res1.Handover == nil {
				t.Fatalf("first process: status %s, want detached", res1.Status)
			}
			if s1.Size() != res1.Handover.LogSize {
				t.Errorf("first stream ends at %d, the handover's log at %d", s1.Size(), res1.Handover.LogSize)
			}
			s2 := output.NewStream("c", "r", output.RunnerLimits())
			if err := s2.Seed(res1.Log, res1.Handover.LogSize); err != nil {
				t.Fatal(err)
			}
			req.Live, req.Detach = s2, nil
			res := eng.Adopt(context.Background(), req, *res1.Handover, res1.Log)
			if res.Status != run.Success {
				t.Fatalf("adopted: status %s (%s)", res.Status, res.Error)
			}
			s2.End(string(res.Status))
			log2, _ := s2.Log()
			if !bytes.Equal(log2, res.Log) || s2.Size() != res.LogSize {
				t.Fatalf("successor's stream log (%d bytes, size %d) is not the final log (%d, size %d)", len(log2), s2.Size(), len(res.Log), res.LogSize)
			}
			got1, got2 := all(t, s1), all(t, s2)
			if strings.Contains(got1, secret) || strings.Contains(got2, secret) {
				t.Errorf("a stream shows the secret:\n%s\n---\n%s", brief(got1), brief(got2))
			}
			// Split across two chunks: masked whole.
			if !strings.Contains(got1, "a pw=*** b\n") {
				t.Errorf("the secret split across two chunks is not masked whole:\n%s", brief(got1))
			}
			// Split across a handover: the first process logs no byte of
			// what it held back, the successor masks the value whole.
			_, afterE, _ := strings.Cut(got1, "\ne ")
			if strings.Contains(afterE, "hun") || !strings.Contains(got2, "\n*** f\n") {
				t.Errorf("the secret split across the handover shows a part:\n%s\n---\n%s", brief(got1), brief(got2))
			}
			// Split across two steps: the value is in neither step's output
			// whole, and the stream is what the final log has.
			if !strings.Contains(got2, "c hunt\n<== step one") || !strings.Contains(got2, "g hunter\n<== step two") {
				t.Errorf("the steps' output is not as printed:\n%s", brief(got2))
			}
			// The first process's stream is the successor's up to where it
			// ended: no gap, no byte twice.
			if !big && !strings.HasPrefix(got2, got1) {
				t.Errorf("the successor's stream does not go on from the first's:\n%s\n---\n%s", brief(got1), brief(got2))
			}
			if end := got1[max(0, len(got1)-300):]; !strings.Contains(got2, end+"knotless-run: adopted by") {
				t.Errorf("the successor's stream does not go on where the first's ended:\n%s\n---\n%s", brief(got1), brief(got2))
			}
			if !big && got2 != string(res.Log) {
				t.Errorf("stream:\n%s\nfinal log:\n%s", got2, res.Log)
			}
		})
	}
}
