package run

import "time"

// Observer is told what the engine does, for the runner's metrics: how
// each step ended and how long it took, and what the caches restored and
// saved. Its methods are cheap, safe for concurrent use and never fail;
// a nil Config.Observer observes nothing.
type Observer interface {
	// StepEnded: a step ended with status (Success, Failure, Error or
	// Cancelled) after d. A step handed over to another process has not
	// ended; the process that adopts it tells its end.
	StepEnded(status string, d time.Duration)
	// CacheRestored: a cache path was restored (hit, bytes of its layer)
	// or the run went without it (a miss: no layer it may read, or one
	// that could not be restored).
	CacheRestored(hit bool, bytes int64)
	// CacheSaved: a cache path's layer of bytes was saved.
	CacheSaved(bytes int64)
}

type noObserver struct{}

func (noObserver) StepEnded(string, time.Duration) {}
func (noObserver) CacheRestored(bool, int64)       {}
func (noObserver) CacheSaved(int64)                {}
