package live_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/output/outputservice/servicetest"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/workflow"
)

// BenchmarkRunLineDelay is the delay end to end: a real run on
// the shell executor whose step echoes each line the benchmark writes
// into a fifo, through the engine (the masker), the runner's live
// output part and then either its listener (direct) or its push to a
// real output service on loopback (through the service), to every
// subscriber's WebSocket. Each line goes once every subscriber has the
// last, so the delay is the path's, not a queue's; it counts from the
// write into the fifo, so the step's shell and the executor's pipe are
// in it too.
//
//	go test ./internal/parts/live -run XXX -bench RunLineDelay -benchtime 300x
func BenchmarkRunLineDelay(b *testing.B) {
	for _, path := range []string{"direct", "through the service"} {
		for _, subscribers := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/%d", strings.ReplaceAll(path, " ", "-"), subscribers), func(b *testing.B) {
				runLineDelay(b, path == "direct", subscribers)
			})
		}
	}
}

func runLineDelay(b *testing.B, direct bool, subscribers int) {
	cfg := live.Config{Listen: "127.0.0.1:0"}
	var tokens *servicetest.Tokens
	base := ""
	if !direct {
		var url string
		url, tokens = service(b)
		cfg = live.Config{Service: url, ServiceDID: serviceDID}
		base = url
	}
	l := live.New(cfg, runner, filepath.Join(b.TempDir(), "files"), live.Ports{Tokens: tokens}, nil)
	if err := l.Start(); err != nil {
		b.Fatal(err)
	}
	stop := l.Serve()
	defer stop()
	if direct {
		base = "http://" + l.Addr().String()
	}
	fifo := filepath.Join(b.TempDir(), "lines")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		b.Fatal(err)
	}
	j := &job.Job{Key: key}
	w := l.Open(j, "r1", nil, nil)
	eng := run.New(run.Config{Executor: shell.New(shell.Config{Root: b.TempDir(), Path: os.Getenv("PATH")})})
	done := make(chan *run.Result, 1)
	go func() {
		done <- eng.Run(context.Background(), run.Request{RunID: "r1", Checkout: b.TempDir(), Live: w,
			Workflow: &workflow.Workflow{Name: "ci", Steps: []workflow.Step{{Name: "echo", Run: `while IFS= read -r l; do printf '%s\n' "$l"; done < ` + fifo}}}})
	}()
	in, err := os.OpenFile(fifo, os.O_WRONLY, 0) // once the step reads it
	if err != nil {
		b.Fatal(err)
	}

	got := make(chan time.Time, subscribers)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range subscribers {
		wg.Go(func() {
			c := &outputhttp.Client{Base: base}
			for ctx.Err() == nil {
				// The service has no stream before the pusher's first put.
				_ = c.Subscribe(ctx, check, 0, func(ev outputhttp.Event) error {
					if ev.Chunk != nil && strings.Contains(string(ev.Chunk.Data), "line ") {
						got <- time.Now()
					}
					return nil
				})
			}
		})
	}
	// Each subscriber has the first line before the clock starts.
	if _, err := fmt.Fprintf(in, "line ready\n"); err != nil {
		b.Fatal(err)
	}
	for range subscribers {
		<-got
	}
	delays := make([]time.Duration, 0, b.N*subscribers)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if _, err := fmt.Fprintf(in, "line %d of the step %s\n", i, strings.Repeat("x", 60)); err != nil {
			b.Fatal(err)
		}
		for range subscribers {
			delays = append(delays, (<-got).Sub(t0))
		}
	}
	b.StopTimer()
	in.Close()
	res := <-done
	l.Ended(j, "r1", res, b.TempDir())
	cancel()
	wg.Wait()
	if res.Status != run.Success {
		b.Fatalf("the run: %s (%s)", res.Status, res.Error)
	}
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(delays[len(delays)/2]), "ms-median")
	b.ReportMetric(ms(delays[len(delays)*99/100]), "ms-p99")
}
