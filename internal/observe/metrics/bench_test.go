package metrics_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/observe/metrics"
)

// observeRun makes the calls one run of three steps with a cache makes:
// its pickup, queue wait, four check writes, the session's start, the
// checkout, scripts, cache and outputs transfers, three steps, the
// cache's restore and save, and its end, with the gauges moving around
// it.
func observeRun(m *metrics.Metrics) {
	m.EventQueued(3 * time.Second)
	m.SetQueueDepth(1)
	m.CheckWritten("queued")
	m.RunStarted(10 * time.Second)
	m.SetQueueDepth(0)
	m.SetRunsGoing(1)
	m.CheckWritten("running")
	m.SessionReady(2 * time.Second)
	m.Transferred(executor.DirectionIn, 1<<20, time.Second)
	m.Transferred(executor.DirectionIn, 1<<10, 100*time.Millisecond)
	m.Transferred(executor.DirectionIn, 1<<22, time.Second)
	m.CacheRestored(true, 1<<22)
	for range 3 {
		m.StepEnded("success", 20*time.Second)
	}
	m.Transferred(executor.DirectionOut, 1<<22, time.Second)
	m.CacheSaved(1 << 22)
	m.Transferred(executor.DirectionOut, 1<<16, 100*time.Millisecond)
	m.RunFinished("success", "push", "kubernetes", 75*time.Second)
	m.CheckWritten("success")
	m.SetRunsGoing(0)
}

// BenchmarkRun is what the metrics add to one run. A run takes seconds
// at the least (a pod's start alone is 1.5 s on the test cluster), so
// ns/op over that is the share of a run's duration (budget: 2 %).
func BenchmarkRun(b *testing.B) {
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		observeRun(m)
	}
	perRun := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perRun/float64(time.Second.Nanoseconds())*100/1.5, "%-of-1.5s-run")
}

// BenchmarkScrape is one scrape of the daemon's metrics with 1,000 runs
// behind it, every series made; B/scrape is its size.
func BenchmarkScrape(b *testing.B) {
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	touchAll(m, 1000)
	var size int
	for b.Loop() {
		size = len(scrape(b, m))
	}
	b.ReportMetric(float64(size), "B/scrape")
}

// BenchmarkFootprint is the heap the metrics hold with every series made
// and 1,000 runs observed (budget: 5 MB of the daemon's RSS).
func BenchmarkFootprint(b *testing.B) {
	var heap float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m, err := metrics.New(prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		touchAll(m, 1000)
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap = float64(after.HeapAlloc) - float64(before.HeapAlloc)
		runtime.KeepAlive(m)
	}
	b.ReportMetric(heap, "heap-B")
}
