// Package backoff is the one schedule of waits after failures that are
// not the work's (a check the PDS did not take, a commit that did not
// fetch, an executor that is unreachable): a first wait, doubling with
// each failure up to a most.
package backoff

import "time"

// Policy is a first wait and the most a wait grows to.
type Policy struct {
	First, Max time.Duration
}

// After is the wait after tries failures (tries ≥ 1): First, doubled
// for each failure after the first, at most Max.
func (p Policy) After(tries int) time.Duration {
	d := p.First
	for i := 1; i < tries && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max)
}
