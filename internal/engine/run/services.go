package run

import (
	"context"
	"errors"
	"strconv"

	"knotless.dev/run/internal/executor"
)

// serviceSpecs are the workflow's services as the executor takes them.
func (r *runState) serviceSpecs() []executor.Service {
	var out []executor.Service
	for _, s := range r.req.Workflow.Services {
		es := executor.Service{
			Name: s.Name, Image: s.Image, Ports: s.Ports, Command: s.Command,
			Ready: executor.Probe{TCP: s.Ready.TCP, HTTPPath: s.Ready.HTTPPath, HTTPPort: s.Ready.HTTPPort, Command: s.Ready.Command, Timeout: s.Ready.Timeout},
		}
		for _, e := range s.Env {
			es.Env = append(es.Env, executor.EnvVar{Name: e.Name, Value: e.Value})
		}
		out = append(out, es)
	}
	return out
}

// stepImages are the images of the steps that name their own, by step
// id.
func (r *runState) stepImages() map[string]string {
	var out map[string]string
	for i, s := range r.req.Workflow.Steps {
		if s.Image == "" {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[strconv.Itoa(i+1)] = s.Image
	}
	return out
}

// watchServices ends runCtx, with the *executor.ServiceError as its
// cause, when a service of the session ends while the run goes on. The
// returned stop ends the watch and waits for it.
func (r *runState) watchServices(runCtx context.Context, sess executor.Session) (context.Context, func()) {
	sr, ok := sess.(executor.ServiceRunner)
	if !ok || len(r.req.Workflow.Services) == 0 {
		return runCtx, func() {}
	}
	ctx, cancel := context.WithCancelCause(runCtx)
	watchCtx, stopWatch := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sr.WatchServices(watchCtx); err != nil {
			r.log.Warn("service ended while the run went on", "err", err)
			cancel(err)
		}
	}()
	return ctx, func() {
		stopWatch()
		<-done
		cancel(nil)
	}
}

// serviceDied is the *executor.ServiceError that ended runCtx, if one did.
func serviceDied(runCtx context.Context) *executor.ServiceError {
	var se *executor.ServiceError
	if runCtx.Err() != nil && errors.As(context.Cause(runCtx), &se) {
		return se
	}
	return nil
}

// logServices writes each service's log to the run log, in a section of
// its own after the steps, masked like the rest.
func (r *runState) logServices(ctx context.Context, sess executor.Session) {
	sr, ok := sess.(executor.ServiceRunner)
	if !ok {
		return
	}
	for _, s := range r.req.Workflow.Services {
		r.logf("==> service %s: log", s.Name)
		if err := sr.ServiceLog(ctx, s.Name, r.out); err != nil {
			r.out.Flush()
			r.logf("knotless-run: the log of service %s could not be read: %v", s.Name, err)
			continue
		}
		r.out.Flush()
		r.logf("<== service %s", s.Name)
	}
}
