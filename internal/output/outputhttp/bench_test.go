package outputhttp_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
)

// BenchmarkMemoryPerFollowedRun: the heap a runner holds for a run
// followed by one subscriber, its stream full (the head and tail the
// final log keeps).
func BenchmarkMemoryPerFollowedRun(b *testing.B) {
	const runs = 20
	hub := output.NewHub(output.HubConfig{MaxRuns: runs})
	h, err := outputhttp.New(outputhttp.Config{Source: hub})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for range b.N {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var streams []*output.Stream
		got := make(chan struct{}, runs)
		line := []byte(strings.Repeat("y", 99) + "\n")
		for i := range runs {
			s, err := hub.Open(fmt.Sprintf("at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.check/k%d", i), "r")
			if err != nil {
				b.Fatal(err)
			}
			streams = append(streams, s)
			for range 20_000 { // 2 MB: past what the stream keeps
				_, _ = s.Write(line)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := &outputhttp.Client{Base: srv.URL}
				var n int64
				_ = c.Subscribe(ctx, s.Check(), 0, func(ev outputhttp.Event) error {
					if ev.Chunk != nil {
						n = ev.Chunk.Offset + int64(len(ev.Chunk.Data))
						if n == s.Size() {
							got <- struct{}{}
						}
					}
					return nil
				})
			}()
		}
		for range runs {
			<-got // each subscriber has caught up and waits for more
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/runs/(1<<20), "MiB/run")
		b.ReportMetric(float64(runtime.NumGoroutine())/runs, "goroutines/run")
		cancel()
		wg.Wait()
		for _, s := range streams {
			s.End("success")
		}
	}
}
