package output_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/rules/workflow"
)

// BenchmarkRunLive: what live output costs a run on the shell executor.
// Each iteration runs a step that prints (bulk: 100 000 lines, 7 MB,
// more output than most runs print, in large writes; lines: 20 000
// lines printed one at a time by a shell loop) three ways, in turn and each first in
// turn: Request.Live off; on (the stream); on with a subscriber
// following over a WebSocket (its client in this process too, so the
// runner's CPU counts the subscriber's side as well). It reports the
// median wall time and the median CPU time of this process (the runner:
// the step's processes are not counted) of each, and the ratios to off.
func BenchmarkRunLive(b *testing.B) {
	for _, w := range []struct{ name, script string }{
		{"bulk", "yes 'a line of build output, about seventy bytes long, as a compiler prints' | head -n 100000"},
		// A line at a time, as a shell loop prints them: many small writes.
		{"lines", `i=0; while [ $i -lt 20000 ]; do echo "compiling file $i of the package"; i=$((i+1)); done`},
	} {
		b.Run(w.name, func(b *testing.B) { benchRunLive(b, w.script) })
	}
}

func benchRunLive(b *testing.B, script string) {
	wf := &workflow.Workflow{Name: "w", Steps: []workflow.Step{{Name: "print", Run: script}}}
	eng := run.New(run.Config{Executor: shell.New(shell.Config{Root: b.TempDir(), Path: os.Getenv("PATH")})})
	checkout := b.TempDir()
	hub := output.NewHub(output.HubConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	clockDone := make(chan struct{})
	go func() { defer close(clockDone); hub.Run(ctx) }() // as the daemon runs it
	defer func() { cancel(); <-clockDone }()
	h, err := outputhttp.New(outputhttp.Config{Source: hub})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	modes := []string{"off", "on", "on+subscriber"}
	wall := map[string][]time.Duration{}
	cpu := map[string][]time.Duration{}
	runOnce := func(mode string, i int) {
		req := run.Request{RunID: fmt.Sprintf("r%d", i), Workflow: wf, Checkout: checkout}
		var s *output.Stream
		var wg sync.WaitGroup
		if mode != "off" {
			s, err = hub.Open("at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.check/k", req.RunID)
			if err != nil {
				b.Fatal(err)
			}
			req.Live = s
		}
		if mode == "on+subscriber" {
			ready := make(chan struct{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := &outputhttp.Client{Base: srv.URL}
				var once sync.Once
				_ = c.Subscribe(context.Background(), s.Check(), 0, func(outputhttp.Event) error {
					once.Do(func() { close(ready) })
					return nil
				})
			}()
			_, _ = s.Write([]byte("subscribed\n"))
			<-ready
		}
		t0, c0 := time.Now(), cpuTime(b)
		res := eng.Run(context.Background(), req)
		if s != nil {
			s.End(string(res.Status))
		}
		wg.Wait()
		wall[mode] = append(wall[mode], time.Since(t0))
		cpu[mode] = append(cpu[mode], cpuTime(b)-c0)
		if res.Status != run.Success {
			b.Fatalf("status %s: %s", res.Status, res.Error)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		for j := range modes {
			runOnce(modes[(i+j)%len(modes)], i)
		}
	}
	b.StopTimer()
	median := func(ds []time.Duration) float64 {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return float64(ds[len(ds)/2]) / float64(time.Millisecond)
	}
	for _, m := range modes {
		b.ReportMetric(median(wall[m]), m+"-ms")
		b.ReportMetric(median(cpu[m]), m+"-cpu-ms")
	}
	for _, m := range modes[1:] {
		b.ReportMetric(median(wall[m])/median(wall["off"]), m+"/off")
		b.ReportMetric(median(cpu[m])/median(cpu["off"]), m+"/off-cpu")
	}
}

// cpuTime is the CPU time this process (the runner) used, user and
// system: what a run costs the runner, whatever else the machine does.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
