package outputservice_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/output/outputpush"
	"knotless.dev/run/internal/output/outputservice/servicetest"
)

// delay measures the delay between a line written to s (the engine's
// Request.Live tap) and each subscriber's receipt of it from base: a
// line at a time, the next once every subscriber has the last, so the
// delay is the path's and not a queue's.
func delay(b *testing.B, s *output.Stream, base string, subscribers int) {
	b.Helper()
	got := make(chan time.Time, subscribers)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range subscribers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &outputhttp.Client{Base: base}
			for ctx.Err() == nil {
				// The service's stream may not be there before the
				// pusher's first put.
				_ = c.Subscribe(ctx, s.Check(), 0, func(ev outputhttp.Event) error {
					if ev.Chunk != nil {
						got <- time.Now()
					}
					return nil
				})
			}
		}()
	}
	// Each subscriber has the first line before the clock starts.
	_, _ = s.Write([]byte("ready\n"))
	for range subscribers {
		<-got
	}
	delays := make([]time.Duration, 0, b.N*subscribers)
	line := []byte(strings.Repeat("x", 79) + "\n")
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		_, _ = s.Write(line)
		for range subscribers {
			delays = append(delays, (<-got).Sub(t0))
		}
	}
	b.StopTimer()
	cancel()
	wg.Wait()
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(delays[len(delays)/2]), "ms-median")
	b.ReportMetric(ms(delays[len(delays)*99/100]), "ms-p99")
}

// BenchmarkLineDelay: the delay a subscriber sees, from the runner's
// listener (direct) and through the output service (the runner's pusher,
// the service's auth and disk store), with 1 and with 100 subscribers,
// all on loopback. The runner's key is in a directory in memory: the
// PDS only mints the token, once per check until it nears expiry.
func BenchmarkLineDelay(b *testing.B) {
	const runnerDID = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
	check := "at://" + runnerDID + "/dev.knotless.check/zsvmur6bdrvdcvafwfoo7mmwp4"
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("direct/subscribers=%d", n), func(b *testing.B) {
			hub := output.NewHub(output.HubConfig{})
			s, _ := hub.Open(check, "r")
			h, err := outputhttp.New(outputhttp.Config{Source: hub})
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			delay(b, s, srv.URL, n)
		})
		b.Run(fmt.Sprintf("service/subscribers=%d", n), func(b *testing.B) {
			base, tokens := servicetest.Start(b, servicetest.Config{ServiceDID: serviceDID, Runner: runnerDID,
				Store: output.StoreConfig{Limits: output.Limits{Head: 8 << 20, Tail: 8 << 20}, MaxRunsPerRunner: 4, MaxFiles: 1, MaxFileBytes: 1, Retention: time.Hour}})
			ctx, cancel := context.WithCancel(context.Background())
			p, err := outputpush.New(outputpush.Config{Service: base, ServiceDID: serviceDID, Tokens: tokens})
			if err != nil {
				b.Fatal(err)
			}
			s := output.NewStream(check, "r", output.RunnerLimits())
			pushed := make(chan error, 1)
			go func() { pushed <- p.Push(ctx, s) }()
			delay(b, s, base, n)
			cancel()
			<-pushed
		})
	}
}
