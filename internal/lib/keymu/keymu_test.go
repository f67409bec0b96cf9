package keymu

import "testing"

// A key's second holder waits for the first; another key does not; no
// entry is kept once nobody holds or waits.
func TestMap(t *testing.T) {
	t.Parallel()
	var k Map
	unlockA := k.Lock("a")
	unlockB := k.Lock("b") // another key: no wait
	got := make(chan struct{})
	go func() {
		defer close(got)
		k.Lock("a")()
	}()
	select {
	case <-got:
		t.Fatal("a second holder of a took it while it was held")
	default:
	}
	unlockA()
	<-got
	unlockB()
	if n := k.held(); n != 0 {
		t.Errorf("%d keys left", n)
	}
}
