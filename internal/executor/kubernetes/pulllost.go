package kubernetes

import (
	"strings"

	"knotless.dev/run/internal/executor"
)

// transientPull are the words of a kubelet's pull error that say the
// registry or the way to it failed for a moment (a timeout, a dropped
// connection, a rate limit, a server error), not that the image is not
// there or not the runner's to pull: such a pull may work when tried
// again.
var transientPull = []string{
	"i/o timeout",
	"tls handshake timeout",
	"connection reset by peer",
	"unexpected eof",
	"too many requests",
	"toomanyrequests",
	"429 ",
	"500 internal server error",
	"502 bad gateway",
	"503 service unavailable",
	"504 gateway timeout",
	"context deadline exceeded",
}

// permanentPull are the words that say the image will not come however
// often it is pulled; they win over transientPull.
var permanentPull = []string{"not found", "manifest unknown", "denied", "unauthorized", "no such host", "invalid reference"}

// pullLost marks err the infrastructure's (executor.Lost) when the
// kubelet's message says the pull failed for a moment.
func pullLost(message string, err error) error {
	m := strings.ToLower(message)
	for _, w := range permanentPull {
		if strings.Contains(m, w) {
			return err
		}
	}
	for _, w := range transientPull {
		if strings.Contains(m, w) {
			return executor.Lost(err)
		}
	}
	return err
}
