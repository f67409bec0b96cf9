package daemon

import (
	"context"
	"sync"
	"time"

	"knotless.dev/run/internal/ingest"
)

// follow subscribes to the event stream of every host the repositories
// live on (or of the relay) and wakes the reconciler when a knotless
// record changes or a stream had a gap. Cursors are saved in state.json.
func (d *Daemon) follow(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	started := map[string]bool{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	save := time.NewTicker(10 * time.Second)
	defer save.Stop()
	for {
		for _, host := range d.eventHosts() {
			if started[host] {
				continue
			}
			started[host] = true
			d.mu.Lock()
			cursor := d.st.Cursors[host]
			d.mu.Unlock()
			fh := &ingest.Firehose{Host: host, Cursor: cursor, Dir: d.cfg.Directory, Logger: d.cfg.Logger.With("component", "ingest")}
			var src ingest.Source = fh
			wg.Go(func() { _ = src.Run(ctx, d.changed) })
		}
		select {
		case <-ctx.Done():
			d.saveCursors()
			return
		case <-tick.C:
		case <-save.C:
			d.saveCursors()
		}
	}
}

// eventHosts are the hosts to follow: the relay, or the PDSes the last
// reconcile found the repositories on.
func (d *Daemon) eventHosts() []string {
	if d.cfg.Relay != "" {
		return []string{d.cfg.Relay}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.hosts...)
}

func (d *Daemon) changed(c ingest.Change) {
	d.lister.Changed(c)
	d.mu.Lock()
	if c.Seq > 0 {
		if d.st.Cursors == nil {
			d.st.Cursors = map[string]int64{}
		}
		d.st.Cursors[c.Host] = c.Seq
		d.cursorsDirty = true
	}
	d.mu.Unlock()
	if c.Gap || (c.Collection != "" && !d.ownCheck(c)) {
		d.log.Debug("records changed", "host", c.Host, "did", c.DID.String(), "collection", c.Collection, "gap", c.Gap)
		d.Wake()
	}
}

func (d *Daemon) saveCursors() {
	d.mu.Lock()
	if !d.cursorsDirty {
		d.mu.Unlock()
		return
	}
	d.cursorsDirty = false
	snap := d.sf.snapshot(d.st)
	d.mu.Unlock()
	if err := d.sf.write(snap); err != nil {
		d.log.Error("save state", "err", err)
	}
}
