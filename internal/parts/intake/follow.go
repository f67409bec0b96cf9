package intake

import (
	"context"
	"sync"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
)

// Follow subscribes to the event stream of every host the repositories
// live on (or of the relay) and wakes the reconciler when a knotless
// record changes or a stream had a gap, until ctx ends. Cursors are
// saved in state.json every 10 s and at the end.
func (in *Intake) Follow(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	started := map[string]bool{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	save := time.NewTicker(10 * time.Second)
	defer save.Stop()
	for {
		for _, host := range in.eventHosts() {
			if started[host] {
				continue
			}
			started[host] = true
			src := in.p.Stream(host, in.p.State.Cursor(host))
			wg.Go(func() { _ = src.Run(ctx, in.changed) })
		}
		select {
		case <-ctx.Done():
			in.saveCursors()
			return
		case <-tick.C:
		case <-save.C:
			in.saveCursors()
		}
	}
}

// eventHosts are the hosts to follow: the relay, or the PDSes the last
// reconcile found the repositories on.
func (in *Intake) eventHosts() []string {
	if in.facts.Relay != "" {
		return []string{in.facts.Relay}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.hosts...)
}

func (in *Intake) changed(c ingest.Change) {
	in.p.Lister.Changed(c)
	if c.Seq > 0 {
		in.p.State.SetCursor(c.Host, c.Seq)
	}
	if c.Gap || (c.Collection != "" && !in.ownCheck(c)) {
		in.log.Debug("records changed", "host", c.Host, "did", c.DID.String(), "collection", c.Collection, "gap", c.Gap)
		in.Wake()
	}
}

// ownCheck reports whether a change is one of the runner's own check
// writes, which never make work and must not wake the reconciler.
func (in *Intake) ownCheck(c ingest.Change) bool {
	return c.DID == in.facts.Runner && c.Collection == forge.CollectionCheck
}

func (in *Intake) saveCursors() {
	if err := in.p.State.SaveCursors(); err != nil {
		in.log.Error("save state", "err", err)
	}
}
