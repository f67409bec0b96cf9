package executor

import "errors"

// ErrInfrastructure marks an error that lost a run for the
// infrastructure's reasons, not the workflow's: its pod evicted or
// disrupted, its node gone, its pod deleted by someone else. An executor
// marks such an error (Lost) where it learns the cause; a workflow's
// retry tries such a run again.
var ErrInfrastructure = errors.New("lost to the infrastructure")

// Lost marks err as the infrastructure's (errors.Is(err,
// ErrInfrastructure)); its text stays err's. Nil stays nil.
func Lost(err error) error {
	if err == nil {
		return nil
	}
	return lostError{err}
}

type lostError struct{ err error }

func (e lostError) Error() string { return e.err.Error() }
func (e lostError) Unwrap() []error {
	return []error{e.err, ErrInfrastructure}
}
