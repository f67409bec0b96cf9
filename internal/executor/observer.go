package executor

import "time"

// Observer is told what an executor does, for the runner's metrics: how
// long a session took to become ready, what crossed into and out of it,
// what sweeps removed and what could not be removed. Its methods are
// cheap, safe for concurrent use and never fail; an executor given none
// uses NoObserver.
type Observer interface {
	// SessionReady: a session can run steps, wait after its objects were
	// created (a Job created → its pod Ready).
	SessionReady(wait time.Duration)
	// Transferred: a tar stream of bytes went into ("in": Put) or out of
	// ("out": Get) a session in d.
	Transferred(direction string, bytes int64, d time.Duration)
	// Swept: a sweep ended, having removed removed sessions; err is why
	// it did not finish (nil when it did).
	Swept(removed int, err error)
	// CleanupFailed: a session's objects could not be removed.
	CleanupFailed()
	// WarmPods: the sessions kept started ahead of runs (serve
	// --warm-pods) are now ready Ready and starting starting.
	WarmPods(ready, starting int)
	// WarmTaken: a run started on a session kept warm.
	WarmTaken()
	// FenceConflict: a create of a run's objects found them there already
	// (AlreadyExists: executor.ErrRunExists, or an earlier one being
	// deleted, waited out).
	FenceConflict()
	// CredentialExpiry: the credential the executor reaches its backend
	// with (named by the executor, e.g. "kubernetes") expires at at.
	CredentialExpiry(credential string, at time.Time)
}

// Transfer directions, as Observer.Transferred names them.
const (
	DirectionIn  = "in"
	DirectionOut = "out"
)

// NoObserver observes nothing.
type NoObserver struct{}

// SessionReady implements Observer.
func (NoObserver) SessionReady(time.Duration) {}

// Transferred implements Observer.
func (NoObserver) Transferred(string, int64, time.Duration) {}

// Swept implements Observer.
func (NoObserver) Swept(int, error) {}

// CleanupFailed implements Observer.
func (NoObserver) CleanupFailed() {}

// WarmPods implements Observer.
func (NoObserver) WarmPods(int, int) {}

// WarmTaken implements Observer.
func (NoObserver) WarmTaken() {}

// FenceConflict implements Observer.
func (NoObserver) FenceConflict() {}

// CredentialExpiry implements Observer.
func (NoObserver) CredentialExpiry(string, time.Time) {}

var _ Observer = NoObserver{}
