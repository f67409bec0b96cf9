package cache

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFairShare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		usage map[string]int64
		limit int64
		want  int64
	}{
		{"no repository", nil, 100, 100},
		{"all fit", map[string]int64{"a": 40, "b": 60}, 100, 100},
		{"one repository over", map[string]int64{"a": 200}, 100, 100},
		{"two heavy: half each", map[string]int64{"a": 100, "b": 100}, 100, 50},
		{"a quiet one leaves its part to the others", map[string]int64{"a": 10, "b": 100, "c": 100}, 110, 50},
		{"two quiet ones", map[string]int64{"a": 10, "b": 10, "c": 100}, 60, 40},
		{"uneven", map[string]int64{"a": 30, "b": 45, "c": 100}, 120, 45},
	}
	for _, tt := range tests {
		if got := FairShare(tt.usage, tt.limit); got != tt.want {
			t.Errorf("%s: FairShare = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// TestEvictionPlan: the repository holding the most bytes loses its
// least recently used layer first, so one within its fair share keeps
// its caches however old they are.
func TestEvictionPlan(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := func(repo, run string, bytes int64, minute int) candidate {
		return candidate{Key{Repo: repo, Workflow: "ci", Path: "/c"}, Layer{Run: run, Bytes: bytes, Used: t0.Add(time.Duration(minute) * time.Minute)}}
	}
	tests := []struct {
		name      string
		layers    []candidate
		limit     int64
		spare     string
		want      []string
		wantShare int64
	}{
		{
			name:   "within the total",
			layers: []candidate{c("a", "a1", 10, 0), c("b", "b1", 10, 1)},
			limit:  20, want: nil, wantShare: 20,
		},
		{
			name:   "a flooding repository loses its own, the quiet one's older layer stays",
			layers: []candidate{c("quiet", "q1", 10, 0), c("flood", "f1", 10, 1), c("flood", "f2", 10, 2), c("flood", "f3", 10, 3), c("flood", "f4", 10, 4)},
			limit:  30, want: []string{"f1", "f2"}, wantShare: 20,
		},
		{
			name: "the largest first, of equal ones the least recently used",
			layers: []candidate{c("a", "a1", 10, 1), c("a", "a2", 10, 2), c("a", "a3", 10, 3),
				c("b", "b1", 10, 0), c("b", "b2", 10, 4), c("c", "c1", 10, 5)},
			limit: 30, want: []string{"a1", "b1", "a2"}, wantShare: 10,
		},
		{
			name:   "spare goes last in its repository",
			layers: []candidate{c("a", "spare", 10, 0), c("a", "a2", 10, 5), c("b", "b1", 10, 1)},
			limit:  20, spare: "spare", want: []string{"a2"}, wantShare: 10,
		},
		{
			name:   "spare goes when its repository has nothing else and is over its share",
			layers: []candidate{c("a", "spare", 40, 5), c("b", "b1", 10, 0)},
			limit:  30, spare: "spare", want: []string{"spare"}, wantShare: 20,
		},
		{
			name:   "one repository: least recently used first",
			layers: []candidate{c("a", "a1", 10, 3), c("a", "a2", 10, 1), c("a", "a3", 10, 2)},
			limit:  15, want: []string{"a2", "a3"}, wantShare: 15,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			plan, share := evictionPlan(tt.layers, tt.limit, tt.spare)
			var got []string
			for _, p := range plan {
				got = append(got, p.layer.Run)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" || share != tt.wantShare {
				t.Errorf("plan (-want +got):\n%s share %d, want %d", diff, share, tt.wantShare)
			}
			usage := map[string]int64{}
			for _, l := range tt.layers {
				usage[l.key.Repo] += l.layer.Bytes
			}
			for _, p := range plan {
				if usage[p.key.Repo] <= share {
					t.Errorf("evicted %s of %s, which holds %d bytes, within the share %d", p.layer.Run, p.key.Repo, usage[p.key.Repo], share)
				}
			}
		})
	}
}

// TestFloodDoesNotEvictAQuietRepository: through the store as the engine
// uses it (save, promote, evict after each), a repository saving cache
// after cache pushes out its own layers, never the quiet repository's
// older one.
func TestFloodDoesNotEvictAQuietRepository(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	layer := tarOf(t, "f", strings.Repeat("x", 8<<10))
	s := open(t, Config{MaxTotal: 4 * int64(len(layer)), now: func() time.Time { return now }})
	saveRun := func(k Key, run string) []Evicted {
		t.Helper()
		now = now.Add(time.Minute)
		if _, err := s.Save(context.Background(), k, run, Layer{Order: "1", Clean: true}, bytes.NewReader(layer)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Promote(k, run); err != nil {
			t.Fatal(err)
		}
		evicted, err := s.Evict(run)
		if err != nil {
			t.Fatal(err)
		}
		return evicted
	}
	quiet := Key{Repo: "quiet", Workflow: "ci", Path: "/cache"}
	saveRun(quiet, "quiet-1")
	var floodEvicted int
	for i := range 8 {
		k := Key{Repo: "flood", Workflow: "wf" + string(rune('a'+i)), Path: "/cache"}
		for _, e := range saveRun(k, "flood-"+string(rune('a'+i))) {
			if e.Key.Repo != "flood" {
				t.Errorf("flood's save %d evicted %s's layer %s", i, e.Key.Repo, e.Layer.Run)
			}
			floodEvicted++
		}
	}
	if floodEvicted != 5 {
		t.Errorf("%d of flood's layers evicted, want 5 (8 saved, 3 fit beside quiet's)", floodEvicted)
	}
	f, _, err := s.Base(quiet, false)
	if err != nil {
		t.Fatalf("the quiet repository lost its cache: %v", err)
	}
	f.Close()
	entries, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, e := range entries {
		total += e.Bytes
	}
	if total > s.cfg.MaxTotal {
		t.Errorf("the store holds %d bytes, over --cache-max-total %d", total, s.cfg.MaxTotal)
	}
}
