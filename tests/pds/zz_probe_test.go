package pds_test

import (
	"encoding/json"
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"

	"knotless.dev/run/tests/pds"
)

func TestZZProbe(t *testing.T) {
	ctx := context.Background()
	s, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	a, err := s.CreateAccount(ctx, "probe")
	if err != nil {
		t.Fatal(err)
	}
	rec := map[string]any{"$type": "dev.knotless.probe", "x": 1}
	rb, _ := json.Marshal(rec)
	raw := (*json.RawMessage)(&rb)
	n := 0
	put := func() {
		n++
		if _, err := a.Put(ctx, "dev.knotless.probe", fmt.Sprintf("k%d", n), rec); err != nil {
			t.Fatal(err)
		}
	}
	med := func(d []time.Duration) time.Duration { sort.Slice(d, func(i, j int) bool { return d[i] < d[j] }); return d[len(d)/2] }
	var one, four, batch []time.Duration
	for i := 0; i < 15; i++ {
		t0 := time.Now()
		put()
		one = append(one, time.Since(t0))
		t0 = time.Now()
		var wg sync.WaitGroup
		for j := 0; j < 4; j++ {
			n++
			k := n
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.Put(ctx, "dev.knotless.probe", fmt.Sprintf("k%d", k), rec)
			}()
		}
		wg.Wait()
		four = append(four, time.Since(t0))
		var writes []*agnostic.RepoApplyWrites_Input_Writes_Elem
		for j := 0; j < 4; j++ {
			n++
			writes = append(writes, &agnostic.RepoApplyWrites_Input_Writes_Elem{RepoApplyWrites_Create: &agnostic.RepoApplyWrites_Create{
				Collection: "dev.knotless.probe", Rkey: ptr(fmt.Sprintf("k%d", n)), Value: raw}})
		}
		f := false
		t0 = time.Now()
		if _, err := agnostic.RepoApplyWrites(ctx, a.Client, &agnostic.RepoApplyWrites_Input{Repo: a.DID.String(), Validate: &f, Writes: writes}); err != nil {
			t.Fatal(err)
		}
		batch = append(batch, time.Since(t0))
	}
	t.Logf("one %v four-concurrent %v applyWrites-4 %v", med(one), med(four), med(batch))
}

func ptr[T any](v T) *T { return &v }
