package daemon

import "context"

// follow would subscribe to the owners' PDSes (or the relay) and wake the
// reconciler on every verified commit that touches a knotless collection.
// Not built yet: the daemon reconciles every Poll.
func (d *Daemon) follow(ctx context.Context) {
	d.log.Warn("event subscription is not built yet; reconciling by listing every poll interval", "poll", d.cfg.Poll)
	<-ctx.Done()
}
