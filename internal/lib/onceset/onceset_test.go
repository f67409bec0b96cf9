package onceset

import (
	"strconv"
	"testing"
)

// A record listed again is said once while it is remembered; past the
// bound, the one least recently looked at goes first.
func TestSet(t *testing.T) {
	t.Parallel()
	s := New(3)
	for _, k := range []string{"a", "b", "c"} {
		if !s.First(k) {
			t.Fatalf("%s is not new", k)
		}
	}
	if s.First("a") || !s.Seen("b") {
		t.Fatal("a or b forgotten within the bound")
	}
	if !s.First("d") { // c, looked at least recently, goes
		t.Fatal("d is not new")
	}
	if s.Seen("c") || !s.Seen("a") || !s.Seen("b") || s.Len() != 3 {
		t.Errorf("after d: c %v, a %v, b %v, %d kept", s.Seen("c"), s.Seen("a"), s.Seen("b"), s.Len())
	}
}

// A Set made with no bound keeps DefaultMax keys.
func TestDefaultMax(t *testing.T) {
	t.Parallel()
	s := New(0)
	for i := range DefaultMax + 1 {
		s.First(strconv.Itoa(i))
	}
	if got := s.Len(); got != DefaultMax {
		t.Errorf("kept %d, want %d", got, DefaultMax)
	}
}
