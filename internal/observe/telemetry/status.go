package telemetry

import (
	"context"
	"sync/atomic"
	"time"

	"knotless.dev/run/internal/observe/status"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/internal/parts/state"
)

// Status is the running daemon's status.Provider: the document made,
// at each request, from what the parts hold.
type Status struct {
	// Daemon is the process: its PID, version, start, executor and
	// runner (Ready and Stopping are filled at each request).
	Daemon status.Daemon
	// Work lists the jobs in hand (scheduler.Scheduler.Work).
	Work func() (running, waiting []scheduler.Item)
	// Counts says whether the daemon is stopping: claiming nothing new
	// (scheduler.Scheduler.Counts).
	Counts func() (running, queued int, draining bool)
	// Owed lists the owed checks (state.Store.Owed).
	Owed func() map[string]state.Owed
	// Down is why the executor cannot take runs now (nil: it can).
	Down func() error
	// Credentials are the executor's (Executor.Credentials); nil: none.
	Credentials func() []status.Credential
	// Replicas is this process's view of the runner's replicas; nil:
	// one process.
	Replicas func() *status.Replicas

	ready atomic.Bool
}

// SetReady marks the daemon ready (READY=1 was sent).
func (s *Status) SetReady() { s.ready.Store(true) }

// Status implements status.Provider.
func (s *Status) Status(context.Context) status.Doc {
	d := s.Daemon
	_, _, d.Stopping = s.Counts()
	d.Ready = s.ready.Load()
	doc := status.Doc{At: time.Now().UTC(), Daemon: &d}
	if err := s.Down(); err != nil {
		doc.Degraded = []string{err.Error()}
	}
	running, waiting := s.Work()
	doc.Runs = make([]status.Run, 0, len(running))
	for _, it := range running {
		ev := it.Job.Event
		r := status.Run{Check: it.Job.Key, RunID: it.RunID, Workflow: it.Job.Workflow.Name, Kind: ev.Kind, Event: ev.URI.String(),
			Commit: ev.Commit, Started: it.Started.UTC(), Session: it.Session, Adopted: it.Adopted}
		if p := it.Progress; p.Step > 0 {
			r.Step, r.Steps, r.StepName, r.StepStarted = p.Step, p.Steps, p.Name, p.Started.UTC()
		}
		doc.Runs = append(doc.Runs, r)
	}
	doc.Queued = make([]status.Queued, 0, len(waiting))
	for _, it := range waiting {
		ev := it.Job.Event
		doc.Queued = append(doc.Queued, status.Queued{Check: it.Job.Key, Workflow: it.Job.Workflow.Name, Kind: ev.Kind,
			Event: ev.URI.String(), Commit: ev.Commit, Since: it.Queued.UTC()})
	}
	// The owed checks as state.json keeps them: FromState's order.
	doc.Owed = status.FromState(&state.State{Owed: s.Owed()}, doc.At).Owed
	if s.Credentials != nil {
		doc.Credentials = s.Credentials()
	}
	if s.Replicas != nil {
		doc.Replicas = s.Replicas()
	}
	return doc
}
