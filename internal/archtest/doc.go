// Package archtest holds tests that keep the module's shape: the pure
// core (workflow, run, the executor contract and the small packages under
// them) imports no Kubernetes, atproto, Docker or Prometheus client, the
// engine and the executors reach the metrics only through their observer
// interfaces, the conformance table imports nothing above the engine
// (CLI, daemon and its state and checks), no executor it is run against
// and no client, the decision cores (merge queue, run control's rules)
// import no executor client and nothing of the daemon, its parts or the
// CLI, the pure parts (the records, the work, job, state, run control's
// rules, the merge queue, workflows) reach no network, process or git
// mirror, the daemon's parts (intake, run control, scheduler, lander,
// checks, job, state) import no other part but through the ports they
// declare, nor the metrics or the telemetry that the daemon plugs into
// their observer ports, and nothing but the CLI imports the daemon, no
// code outside internal/parts/state assigns to the state and none outside
// internal/parts/checks makes a check record or sets its status, and every
// package says what it is for in a doc comment. It has no code of its
// own.
package archtest
