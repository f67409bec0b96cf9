package intake

import (
	"context"
	"sync"

	"knotless.dev/run/internal/ingest"
)

// ConsiderAtOnce is how many repositories' events a reconcile considers
// at once: a burst of pushes to many repositories is fetched, read and
// queued side by side, not one after another, and no more than this
// many fetches and workflow reads go on together.
const ConsiderAtOnce = 4

// lanes splits events by repository, each lane in the listing's order
// (oldest first: a newer push supersedes an older one of its ref only
// after it), the lanes in the order of their first event.
func lanes(events []ingest.Event) [][]ingest.Event {
	var out [][]ingest.Event
	at := map[string]int{}
	for _, ev := range events {
		repo := ev.Repo.URI.String()
		i, ok := at[repo]
		if !ok {
			i = len(out)
			at[repo] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], ev)
	}
	return out
}

// eachLane calls f for every event, the events of one repository one
// after another, at most limit repositories at once, and returns when
// every call has returned. It starts no lane once ctx has ended.
//
// When there are several lanes, each expects a check write (expect, nil
// for none): the running records of the burst's runs start a few
// milliseconds apart, and the expectations of the lanes still being
// considered hold the first ones back (a little) to go with the others
// in one commit. A lane's expectation ends at its first check write or
// when it ends.
func eachLane(ctx context.Context, events []ingest.Event, limit int, expect func(context.Context) (context.Context, func()), f func(context.Context, ingest.Event)) {
	limit = max(limit, 1)
	slots := make(chan struct{}, limit)
	var wg sync.WaitGroup
	defer wg.Wait()
	all := lanes(events)
	for _, lane := range all {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		lctx, done := ctx, func() {}
		if expect != nil && len(all) > 1 {
			lctx, done = expect(ctx)
		}
		wg.Go(func() {
			defer func() { <-slots }()
			defer done()
			for _, ev := range lane {
				if lctx.Err() != nil {
					return
				}
				f(lctx, ev)
			}
		})
	}
}
