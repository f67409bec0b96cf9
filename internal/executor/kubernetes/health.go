package kubernetes

import (
	"context"
	"fmt"
)

// Health reports whether the cluster can take runs now: the credentials
// load and have not expired (one close to expiry is logged, once per
// token), and the API server answers. The daemon calls it on a timer, so
// an expiring token is told about even when no run touches the cluster.
func (e *Executor) Health(ctx context.Context) error {
	_, cs, _, err := e.clients.get()
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
		return fmt.Errorf("cluster unreachable: %w", err)
	}
	return nil
}
