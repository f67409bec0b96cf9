package pds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"

	"knotless.dev/run/tests/pds"
)

// BenchmarkCommitsOfOneRepository measures how the PDS takes writes to
// one repository: one putRecord, four at once, and one applyWrites of
// four. It commits a repository's writes one at a time, which is why
// the runner sends the check writes that wait for one another as one
// commit (internal/parts/checks/groupcommit.go). Medians, in milliseconds, and
// the two ratios to one write.
func BenchmarkCommitsOfOneRepository(b *testing.B) {
	ctx := context.Background()
	s, err := pds.Start(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	a, err := s.CreateAccount(ctx, "commits")
	if err != nil {
		b.Fatal(err)
	}
	const collection = "dev.knotless.benchmark"
	rec := map[string]any{"$type": collection, "n": 1}
	raw, err := json.Marshal(rec)
	if err != nil {
		b.Fatal(err)
	}
	value := json.RawMessage(raw)
	n := 0
	key := func() string { n++; return fmt.Sprintf("k%d", n) }
	put := func(k string) error {
		_, err := a.Put(ctx, collection, k, rec)
		return err
	}
	timed := func(f func() error) time.Duration {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var one, four, batch []time.Duration
	for b.Loop() {
		one = append(one, timed(func() error { return put(key()) }))
		four = append(four, timed(func() error {
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				k := key()
				wg.Go(func() { errs[i] = put(k) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return err
				}
			}
			return nil
		}))
		var writes []*agnostic.RepoApplyWrites_Input_Writes_Elem
		for range 4 {
			k := key()
			writes = append(writes, &agnostic.RepoApplyWrites_Input_Writes_Elem{RepoApplyWrites_Create: &agnostic.RepoApplyWrites_Create{
				Collection: collection, Rkey: &k, Value: &value}})
		}
		validate := false
		batch = append(batch, timed(func() error {
			_, err := agnostic.RepoApplyWrites(ctx, a.Client, &agnostic.RepoApplyWrites_Input{Repo: a.DID.String(), Validate: &validate, Writes: writes})
			return err
		}))
	}
	median := func(d []time.Duration) time.Duration { d = slices.Clone(d); slices.Sort(d); return d[len(d)/2] }
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(median(one)), "one-put-ms")
	b.ReportMetric(ms(median(four)), "four-puts-at-once-ms")
	b.ReportMetric(ms(median(batch)), "one-batch-of-four-ms")
	b.ReportMetric(float64(median(four))/float64(median(one)), "four-over-one")
	b.ReportMetric(float64(median(batch))/float64(median(one)), "batch-over-one")
}
