package output_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/outputhttp"
	"knotless.dev/run/internal/run"
	"knotless.dev/run/internal/workflow"
)

// BenchmarkRunLive: what live output costs a run on the shell executor:
// a step that prints 100 000 lines (7 MB, more output than most runs
// print), with Request.Live off, on (the stream), and on with a
// subscriber following over a WebSocket (its client in this process
// too, so runner-cpu-ms counts the subscriber's side as well).
func BenchmarkRunLive(b *testing.B) {
	wf := &workflow.Workflow{Name: "w", Steps: []workflow.Step{{Name: "print",
		Run: "yes 'a line of build output, about seventy bytes long, as a compiler prints' | head -n 100000"}}}
	for _, mode := range []string{"off", "on", "on+subscriber"} {
		b.Run("live="+mode, func(b *testing.B) {
			eng := run.New(run.Config{Executor: shell.New(shell.Config{Root: b.TempDir()})})
			checkout := b.TempDir()
			hub := output.NewHub(output.HubConfig{})
			h, err := outputhttp.New(outputhttp.Config{Source: hub})
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			cpu0 := cpuTime(b)
			b.ResetTimer()
			for i := range b.N {
				req := run.Request{RunID: "r", Workflow: wf, Checkout: checkout}
				var wg sync.WaitGroup
				if mode != "off" {
					s, err := hub.Open("at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.check/k", "r"+string(rune('a'+i%26)))
					if err != nil {
						b.Fatal(err)
					}
					req.Live = s
					if mode == "on+subscriber" {
						ready := make(chan struct{})
						wg.Add(1)
						go func() {
							defer wg.Done()
							c := &outputhttp.Client{Base: srv.URL}
							once := sync.Once{}
							_ = c.Subscribe(context.Background(), s.Check(), 0, func(outputhttp.Event) error {
								once.Do(func() { close(ready) })
								return nil
							})
						}()
						_, _ = s.Write([]byte("subscribed\n"))
						<-ready
					}
					res := eng.Run(context.Background(), req)
					s.End(string(res.Status))
				} else {
					res := eng.Run(context.Background(), req)
					if res.Status != run.Success {
						b.Fatalf("status %s: %s", res.Status, res.Error)
					}
				}
				wg.Wait()
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(time.Millisecond)/float64(b.N), "runner-cpu-ms/op")
		})
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
