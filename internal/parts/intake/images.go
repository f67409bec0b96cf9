package intake

import (
	"context"
	"time"

	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// imageCheckTimeout bounds the check of one image.
const imageCheckTimeout = 10 * time.Second

// warnImages warns, once per image in the process's life, when a
// workflow that runs here for ev names an image (or takes the default
// one, or names one for a service) that the executor cannot find (Ports.CheckImage: on Docker, not
// on the daemon and not served by its registry). Its runs would end
// error at their first pull; the warning says so before one runs, and
// at start, after a move to another executor. Only the owner's pushes
// are looked at: a stranger's pull does not make the runner ask a
// registry it names (its run, if it runs, ends at its first failed
// pull, naming the image).
func (in *Intake) warnImages(ctx context.Context, ev work.Event, wfs []*workflow.Workflow) {
	if in.p.CheckImage == nil || !ev.Trusted {
		return
	}
	for _, wf := range workflow.Plan(wfs) {
		if !job.RunsFor(wf, ev) || !wf.AllowsRunner(in.facts.Runner.String()) {
			continue
		}
		image := wf.Image
		if image == "" {
			image = in.facts.DefaultImage
		}
		// Its steps' and services' images are pulled for its runs as
		// its own is.
		for _, image := range append(append([]string{image}, wf.StepImages()...), wf.ServiceImages()...) {
			in.warnImage(ctx, ev, wf, image)
		}
	}
}

// warnImage is warnImages for one image of wf.
func (in *Intake) warnImage(ctx context.Context, ev work.Event, wf *workflow.Workflow, image string) {
	if _, seen := in.images.LoadOrStore(image, true); seen {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, imageCheckTimeout)
	err := in.p.CheckImage(cctx, image)
	cancel()
	if err != nil && ctx.Err() == nil {
		in.log.Warn("the executor cannot find the image a workflow names: its runs will end error", "image", image,
			"workflow", wf.Name, "file", wf.File, "repo", ev.Repo.URI.String(), "err", err)
	}
}

// warnWatchedImages is warnImages, once, for the newest push of each
// watched repository, done or not, whose commit its mirror holds (no
// fetch): at start the runner looks at what it watches, not only at new
// work.
func (in *Intake) warnWatchedImages(ctx context.Context, snap *ingest.Snapshot) {
	if in.p.CheckImage == nil || !in.imagesAtStart.CompareAndSwap(false, true) {
		return
	}
	newest := map[string]work.Event{}
	var order []string
	for _, ev := range snap.Events { // oldest first
		if !ev.Trusted || ev.Repo.URI == "" {
			continue
		}
		key := ev.Repo.URI.String()
		if _, ok := newest[key]; !ok {
			order = append(order, key)
		}
		newest[key] = ev
	}
	for _, key := range order {
		ev := newest[key]
		repo, err := in.p.Mirrors.Open(ctx, job.MirrorKey(ev))
		if err != nil || !repo.Has(ctx, ev.Commit) {
			continue
		}
		wfs, _, err := repo.Workflows(ctx, ev.Commit)
		if err != nil {
			continue
		}
		in.warnImages(ctx, ev, wfs)
	}
}
