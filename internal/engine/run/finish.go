package run

import (
	"context"
	"errors"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/mask"
)

// faultStatus is the status of a fault outside any step: Cancelled when
// the run was cancelled, else Error.
func (r *runState) faultStatus(ctx context.Context) Status {
	if ctx.Err() != nil {
		return Cancelled
	}
	return Error
}

// classify turns a step's error into a status.
func (r *runState) classify(ctx context.Context, err error) Status {
	var se *StepError
	switch {
	case ctx.Err() != nil:
		return Cancelled
	case errors.As(err, &se):
		return Failure
	default:
		return Error
	}
}

// fail records the first thing that ended the run.
func (r *runState) fail(status Status, step string, err error) {
	if r.res.Status != "" && r.res.Status != Success {
		return
	}
	r.res.Status, r.res.FailedStep, r.res.Error = status, step, err.Error()
	r.res.Lost = status == Error && errors.Is(err, executor.ErrInfrastructure)
	if se := (*StepError)(nil); errors.As(err, &se) {
		r.res.StepError = se
	}
	if r.out != nil {
		r.logf("knotless-run: %s: %s", status, err)
	}
}

func (r *runState) finish() {
	if r.res.Status == "" {
		r.res.Status = Error
		r.res.Error = "run ended without a status"
	}
	if r.out != nil {
		_ = r.out.Flush()
	}
	if r.granted != nil && r.res.Error != "" {
		r.res.Error = mask.String(r.res.Error, r.grantedValues())
	}
	r.res.FinishedAt = time.Now().UTC()
	r.res.Mask = r.mask
	r.res.Log = r.buf.Bytes()
	r.res.LogSize = r.buf.Total()
	r.log.Info("run finished", "status", r.res.Status, "failed_step", r.res.FailedStep, "duration", r.res.FinishedAt.Sub(r.res.StartedAt).Round(time.Millisecond))
}
