package intake

import (
	"context"
	"sync"

	"knotless.dev/run/internal/rules/work"
)

// ConsiderAtOnce is how many repositories' events a reconcile considers
// at once: a burst of pushes to many repositories is fetched, read and
// queued side by side, not one after another, and no more than this
// many fetches and workflow reads go on together.
const ConsiderAtOnce = 4

// lanes splits events by repository, each lane in the listing's order
// (oldest first: a newer push supersedes an older one of its ref only
// after it), the lanes in the order of their first event.
func lanes(events []work.Event) [][]work.Event {
	var out [][]work.Event
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
// in one commit. The first limit lanes expect theirs before any lane
// starts, so that a lane quick to its first write does not find the
// others not expecting yet. A lane's expectation ends at its first
// check write or when it ends.
func eachLane(ctx context.Context, events []work.Event, limit int, expect func(context.Context) (context.Context, func()), f func(context.Context, work.Event)) {
	limit = max(limit, 1)
	slots := make(chan struct{}, limit)
	var wg sync.WaitGroup
	defer wg.Wait()
	all := lanes(events)
	ctxs := make([]context.Context, len(all))
	dones := make([]func(), len(all))
	prepare := func(i int) {
		ctxs[i], dones[i] = ctx, func() {}
		if expect != nil && len(all) > 1 {
			ctxs[i], dones[i] = expect(ctx)
		}
	}
	for i := range min(limit, len(all)) {
		prepare(i)
	}
	for i, lane := range all {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			for _, done := range dones[i:] {
				if done != nil {
					done()
				}
			}
			return
		}
		if dones[i] == nil {
			prepare(i)
		}
		lctx, done := ctxs[i], dones[i]
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
