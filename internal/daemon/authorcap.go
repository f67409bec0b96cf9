package daemon

import (
	"knotless.dev/run/internal/ingest"
)

// The per-author cap: one stranger's pull spam must not fill the queue
// ahead of the owner's pushes, nor spend the runner's PDS write quota on
// queued checks. See docs/design/daemon.md, "The queue".
const (
	// DefaultMaxQueuedPerAuthor is the cap when Config sets none.
	DefaultMaxQueuedPerAuthor = 4
	// NoCap, as Config.MaxQueuedPerAuthor, turns the cap off.
	NoCap = -1
)

// author is whom the cap counts an event against: the account that
// wrote an untrusted event (a pull's record); "" for trusted work, which
// is never capped.
func author(ev ingest.Event) string {
	if ev.Trusted {
		return ""
	}
	return ev.URI.Authority().String()
}

// overAuthorCap reports whether ev must wait: its author already has max
// pulls in hand (queued or running, counted by pull, not by workflow or
// commit) and ev is not a newer commit of one of them, which takes the
// older one's place through supersede. held is how many pulls the author
// has in hand.
func overAuthorCap(inHand []*job, ev ingest.Event, max int) (over bool, held int) {
	a := author(ev)
	if a == "" || max <= 0 {
		return false, 0
	}
	pulls := map[string]bool{}
	for _, j := range inHand {
		if author(j.ev) == a {
			pulls[j.ev.URI.String()] = true
		}
	}
	if pulls[ev.URI.String()] {
		return false, len(pulls)
	}
	return len(pulls) >= max, len(pulls)
}

// claimIndex is the queued job a worker takes next: the first trusted
// one (the owner's pushes go ahead of strangers' pulls), else the first.
func claimIndex(queue []*job) int {
	for i, j := range queue {
		if j.ev.Trusted {
			return i
		}
	}
	return 0
}
