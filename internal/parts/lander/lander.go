// Package lander is the daemon's lander part: with --queue, it lands
// the merge queue of every repository whose lander this runner is
// (mergequeue.IsLander). Each step reads the records (the owner's queue
// entries, the lander's own batches and ejections), asks the pure core
// (internal/rules/mergequeue) what to do and does it; pre-flights and batches
// are handed to intake as ordinary untrusted events, so their checks are
// kept like any other. A repository has at most one unfinished batch;
// its record says where it stands, so a restarted lander goes on from
// it (Resume).
//
// The lander runs in goroutines of its own, one per repository it
// lands, each taking the newest listing intake offers (Offer never
// blocks): a slow push holds neither intake nor another repository.
package lander

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/parts/checks"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/mergequeue"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

// identity is the author and committer of squashed commits.
var identity = job.Identity{Name: "knotless-run lander", Email: "lander@knotless.invalid"}

// landerMemory is what state.json keeps per repository for the lander.
type landerMemory struct {
	Bisect mergequeue.Bisect `json:"bisect"`
}

// landRepo takes one step of a repository's queue: the unfinished batch
// if there is one, else ejections, pre-flights and the next batch.
func (l *Lander) landRepo(ctx context.Context, repo forge.Record[forge.Repo], log *slog.Logger) error {
	uri := repo.URI.String()
	rec, err := l.listQueue(ctx, repo, log)
	if err != nil {
		return err
	}
	mem := l.landerMemory(uri)
	going, done, failed := sortBatches(uri, rec.batches, rec.ejections)
	if going != nil {
		return l.advance(ctx, repo, *going, &mem, log)
	}
	in, pulls, err := l.queueInput(ctx, repo, rec.entries, done, log)
	if err != nil {
		return err
	}
	plan := mergequeue.Decide(in)
	if err := l.ejectAndPreflight(ctx, repo, plan, pulls, log); err != nil {
		return err
	}
	if !plan.Settled() {
		return nil
	}
	next := mergequeue.Next(plan.Ready, l.cfg.Batch, mem.Bisect)
	if len(next) == 0 {
		return nil
	}
	return l.startBatch(ctx, repo, next, pulls, failed, &mem, log)
}

// queueRecords are the records a repository's queue is decided from:
// its owner's queue entries, and the lander's batches and ejections
// (of every repository).
type queueRecords struct {
	entries   []forge.Record[forge.QueueEntry]
	batches   []forge.Record[forge.Batch]
	ejections []forge.Record[forge.Ejection]
}

// listQueue lists them; a record that does not match its lexicon is
// logged and left out.
func (l *Lander) listQueue(ctx context.Context, repo forge.Record[forge.Repo], log *slog.Logger) (queueRecords, error) {
	var rec queueRecords
	owner, err := repo.URI.Authority().AsDID()
	if err != nil {
		return rec, fmt.Errorf("repository owner: %w", err)
	}
	var bad []forge.Invalid
	if rec.entries, bad, err = l.p.Records.Entries(ctx, owner); err != nil {
		return rec, err
	}
	warnInvalid(log, bad)
	if rec.batches, bad, err = l.p.Records.Batches(ctx); err != nil {
		return rec, err
	}
	warnInvalid(log, bad)
	if rec.ejections, bad, err = l.p.Records.Ejections(ctx); err != nil {
		return rec, err
	}
	warnInvalid(log, bad)
	return rec, nil
}

// sortBatches reads the batches and ejections of the repository uri:
// the batch still going (building or running), if one is; the pulls at
// their commits that are done (ejected or landed); and the failed
// batches, by record key.
func sortBatches(uri string, batches []forge.Record[forge.Batch], ejections []forge.Record[forge.Ejection]) (going *forge.Record[forge.Batch], done map[mergequeue.PullCommit]bool, failed map[string]forge.Batch) {
	done = map[mergequeue.PullCommit]bool{}
	for _, e := range ejections {
		if e.Value.Repo == uri {
			done[mergequeue.PullCommit{Pull: e.Value.Pull, Commit: e.Value.Commit}] = true
		}
	}
	failed = map[string]forge.Batch{}
	for _, b := range batches {
		if b.Value.Repo != uri {
			continue
		}
		switch b.Value.Status {
		case forge.BatchBuilding, forge.BatchRunning:
			return &b, done, failed
		case forge.BatchLanded:
			for _, p := range b.Value.Pulls {
				done[mergequeue.PullCommit(p)] = true
			}
		case forge.BatchFailed:
			failed[b.URI.RecordKey().String()] = b.Value
		}
	}
	return nil, done, failed
}

// queueInput is what mergequeue.Decide decides the repository's queue
// from: its entries, the pulls they queue (read, and returned by AT-URI)
// and the pre-flight of each open pull at its queued commit and base
// (judged now: Verdict, or started by Decide's plan).
func (l *Lander) queueInput(ctx context.Context, repo forge.Record[forge.Repo], entries []forge.Record[forge.QueueEntry], done map[mergequeue.PullCommit]bool, log *slog.Logger) (mergequeue.Input, map[string]forge.Pull, error) {
	uri := repo.URI.String()
	self := l.runner
	in := mergequeue.Input{Repo: uri, Lander: self, MayLand: mergequeue.MayPush(&repo.Value, self),
		Pulls: map[string]mergequeue.Pull{}, Preflights: map[mergequeue.PullCommit]mergequeue.Preflight{}, NeedPreflight: true, Done: done}
	pulls := map[string]forge.Pull{}
	for _, e := range entries {
		v := e.Value
		if v.Repo != uri {
			continue
		}
		in.Entries = append(in.Entries, mergequeue.Entry{Key: e.URI.RecordKey().String(), Pull: v.Pull, Commit: v.Commit, Base: v.Base, CreatedAt: v.CreatedAt})
		pc := mergequeue.PullCommit{Pull: v.Pull, Commit: v.Commit}
		if done[pc] || !in.MayLand {
			continue // !MayLand: Decide ejects it
		}
		p, err := l.p.Records.Pull(ctx, syntax.ATURI(v.Pull))
		if err != nil {
			if errors.Is(err, pdsclient.ErrNotFound) {
				continue // gone: Decide ejects it
			}
			return in, nil, fmt.Errorf("read queued pull: %w", err)
		}
		pulls[v.Pull] = p
		in.Pulls[v.Pull] = mergequeue.Pull{Repo: p.Repo, Base: p.Base, Head: p.Head.Commit, Open: p.State == forge.PullOpen}
		if p.Repo == uri && p.State == forge.PullOpen && p.Head.Commit == v.Commit && v.Base != "" && p.Base == v.Base {
			pf, err := l.preflight(ctx, preflightEvent(repo, v.Pull, p))
			if err != nil {
				log.Warn("pre-flight not judged; tried again at the next reconcile", "pull", v.Pull, "err", err)
				pf = mergequeue.Preflight{Verdict: mergequeue.Pending}
			}
			in.Preflights[pc] = pf
		}
	}

	return in, pulls, nil
}

// ejectAndPreflight does what plan says of the queue's pulls now: ejects
// the ones it ejects, and starts the pre-flights it asks for (a start
// that fails is logged: the next reconcile tries again).
func (l *Lander) ejectAndPreflight(ctx context.Context, repo forge.Record[forge.Repo], plan mergequeue.Plan, pulls map[string]forge.Pull, log *slog.Logger) error {
	for _, ej := range plan.Eject {
		if err := l.eject(ctx, repo.URI.String(), ej, "", log); err != nil {
			return err
		}
	}
	for _, q := range plan.Preflight {
		ev := preflightEvent(repo, q.Pull, pulls[q.Pull])
		if err := l.p.Intake.Consider(ctx, ev); err != nil {
			log.Error("pre-flight not started", "pull", q.Pull, "err", err)
		}
	}
	return nil
}

func warnInvalid(log *slog.Logger, bad []forge.Invalid) {
	for _, b := range bad {
		log.Warn("record does not match its lexicon; ignored", "uri", b.URI.String(), "err", b.Err)
	}
}

// preflightEvent is the pre-flight of a queued pull: the pull's head
// merged onto its base, untrusted, running its queue: first workflows.
func preflightEvent(repo forge.Record[forge.Repo], uri string, p forge.Pull) work.Event {
	return work.Event{Kind: forge.KindPull, URI: syntax.ATURI(uri), Repo: repo, Ref: "refs/heads/" + p.Base, Commit: p.Head.Commit,
		Pull: &p, Preflight: true}
}

// batchEvent is the work of a batch: its on: batch workflows on the
// squashed commit, untrusted.
func batchEvent(repo forge.Record[forge.Repo], b forge.Record[forge.Batch]) work.Event {
	return work.Event{Kind: forge.KindBatch, URI: b.URI, Repo: repo, Ref: b.Value.Ref, Commit: b.Value.Squashed}
}

// preflight judges a queued pull's pre-flight from its checks: the
// queue: first workflows of the pull merged onto its base.
func (l *Lander) preflight(ctx context.Context, ev work.Event) (mergequeue.Preflight, error) {
	m, tree, conflict, err := l.p.Intake.Prepare(ctx, ev)
	if err != nil {
		return mergequeue.Preflight{}, err
	}
	if conflict != nil {
		return mergequeue.Preflight{Verdict: mergequeue.Conflict, Detail: "conflicts with the base branch: " + conflict.Detail}, nil
	}
	wfs, _, err := m.Workflows(ctx, tree)
	if err != nil {
		return mergequeue.Preflight{}, err
	}
	v, detail := l.verdict(ev, wfs)
	switch v {
	case checks.Failed:
		return mergequeue.Preflight{Verdict: mergequeue.Failed, Detail: "pre-flight " + detail}, nil
	case checks.Unknown:
		return mergequeue.Preflight{Verdict: mergequeue.NotRun}, nil
	case checks.Waiting:
		return mergequeue.Preflight{Verdict: mergequeue.Pending}, nil
	}
	return mergequeue.Preflight{Verdict: mergequeue.Passed}, nil
}

// verdict reads the checks of the workflows of wfs that run for ev:
// all succeeded, one failed (detail names it), or not there yet.
func (l *Lander) verdict(ev work.Event, wfs []*workflow.Workflow) (checks.Verdict, string) {
	var names []string
	for _, wf := range workflow.Plan(wfs) {
		if job.RunsFor(wf, ev) && wf.AllowsRunner(l.runner) {
			names = append(names, wf.Name)
		}
	}
	return l.p.Checks.Verdict(ev.Subject(), names)
}

// eject writes the ejection record of a pull leaving the queue.
func (l *Lander) eject(ctx context.Context, repo string, ej mergequeue.Ejection, batch string, log *slog.Logger) error {
	rec := forge.Ejection{Type: forge.CollectionEjection, Repo: repo, Pull: ej.Pull, Commit: ej.Commit, Reason: ej.Reason,
		Detail: checks.Truncate(ej.Detail, checks.MaxError), Batch: batch, CreatedAt: forge.Now()}
	if _, err := l.p.Records.Put(ctx, forge.CollectionEjection, forge.EjectionKey(ej.Pull, ej.Commit), rec); err != nil {
		return fmt.Errorf("write ejection: %w", err)
	}
	log.Info("pull left the merge queue", "pull", ej.Pull, "commit", ej.Commit, "reason", ej.Reason, "detail", ej.Detail)
	if l.p.Observer != nil {
		l.p.Observer.Ejected(repo, ej.Reason)
	}
	return nil
}

// startBatch squashes the next pulls onto the base, ejects those that do
// not merge, writes the batch record and starts its checks.
func (l *Lander) startBatch(ctx context.Context, repo forge.Record[forge.Repo], next []mergequeue.Queued, pulls map[string]forge.Pull,
	failed map[string]forge.Batch, mem *landerMemory, log *slog.Logger) error {
	uri := repo.URI.String()
	branch := next[0].Base
	m, err := l.p.Mirrors.Open(ctx, job.BatchMirrorKey(uri))
	if err != nil {
		return err
	}
	base, err := m.Branch(ctx, repo.Value.Source, branch)
	if err != nil {
		return err
	}
	createdAt := forge.Now()
	tip, merges, err := l.squash(ctx, m, base, next, pulls, createdAt)
	if err != nil {
		return err
	}
	in, out := mergequeue.Sort(merges)
	for _, ej := range out {
		if err := l.eject(ctx, uri, ej, "", log); err != nil {
			return err
		}
	}
	if len(in) == 0 {
		return nil
	}
	if len(in) < len(next) {
		// Squash again without the ejected pulls: the same commits, and
		// the tip of those that stay.
		var keep []mergequeue.Queued
		for _, q := range next {
			if containsPull(in, q.PullCommit) {
				keep = append(keep, q)
			}
		}
		if tip, _, err = l.squash(ctx, m, base, keep, pulls, createdAt); err != nil {
			return err
		}
	}
	bp := make([]forge.BatchPull, len(in))
	for i, p := range in {
		bp[i] = forge.BatchPull(p)
	}
	key := forge.BatchKey(uri, base, bp)
	if old, ok := failed[key]; ok {
		// This very batch failed before and the bisection was lost
		// (state.json): bisect again instead of running it again.
		mem.Bisect, _ = mem.Bisect.Failed(in, old.Error)
		if len(in) == 1 {
			return l.eject(ctx, uri, mergequeue.Ejection{PullCommit: in[0], Reason: forge.EjectBatch, Detail: old.Error}, "", log)
		}
		l.p.Wake() // the first half runs now, not at the next poll
		return l.saveLanderMemory(uri, *mem)
	}
	b := forge.Batch{Type: forge.CollectionBatch, Repo: uri, Ref: "refs/heads/" + branch, Base: base, Pulls: bp, Squashed: tip,
		Status: forge.BatchRunning, CreatedAt: createdAt}
	at, err := l.p.Records.Put(ctx, forge.CollectionBatch, key, b)
	if err != nil {
		return fmt.Errorf("write batch: %w", err)
	}
	log.Info("batch built", "batch", at.String(), "base", base, "squashed", tip, "pulls", len(bp))
	return l.advance(ctx, repo, forge.Record[forge.Batch]{URI: at, Value: b}, mem, log)
}

func containsPull(ps []mergequeue.PullCommit, p mergequeue.PullCommit) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// squash fetches the pulls' heads into the batch mirror and squashes
// them onto base, at the batch's creation time (so again gives the same
// commits).
func (l *Lander) squash(ctx context.Context, m job.Repo, base string, qs []mergequeue.Queued, pulls map[string]forge.Pull,
	createdAt string) (string, []mergequeue.Merge, error) {
	at, err := syntax.ParseDatetimeLenient(createdAt)
	if err != nil {
		return "", nil, fmt.Errorf("batch time: %w", err)
	}
	sps := make([]job.SquashPull, len(qs))
	for i, q := range qs {
		p, ok := pulls[q.Pull]
		if !ok {
			return "", nil, fmt.Errorf("squash: pull %s not read", q.Pull)
		}
		if err := m.Fetch(ctx, job.PullSource, p.Head.Source, p.Head.Ref, q.Commit); err != nil {
			return "", nil, fmt.Errorf("squash: %w", err)
		}
		sps[i] = job.SquashPull{Head: q.Commit, Message: p.Title + "\n\nPull: " + q.Pull}
	}
	tip, squashed, err := m.Squash(ctx, base, sps, identity, at.Time())
	if err != nil {
		return "", nil, err
	}
	merges := make([]mergequeue.Merge, len(qs))
	for i, s := range squashed {
		merges[i] = mergequeue.Merge{PullCommit: qs[i].PullCommit, Conflicts: s.Conflicts, ConflictsWithBase: s.ConflictsWithBase, Changed: s.Changed}
	}
	return tip, merges, nil
}

// advance takes one step of an unfinished batch (mergequeue.Resume):
// record a push that happened, void a batch whose base moved, or run its
// checks and, when they all succeeded, push it.
func (l *Lander) advance(ctx context.Context, repo forge.Record[forge.Repo], b forge.Record[forge.Batch], mem *landerMemory, log *slog.Logger) error {
	v := b.Value
	uri := repo.URI.String()
	log = log.With("batch", b.URI.String())
	branch := strings.TrimPrefix(v.Ref, "refs/heads/")
	m, err := l.p.Mirrors.Open(ctx, job.BatchMirrorKey(uri))
	if err != nil {
		return err
	}
	head, err := m.Branch(ctx, repo.Value.Source, branch)
	if err != nil {
		return err
	}
	switch mergequeue.Resume(v, head, false) {
	case mergequeue.Finished:
		return nil
	case mergequeue.RecordLanding:
		return l.landed(ctx, b, mem, log)
	case mergequeue.Rebuild:
		return l.void(ctx, b, fmt.Sprintf("the base branch moved from %s to %s before the push; its pulls go back to the queue", v.Base, head), log)
	}
	if !mergequeue.MayPush(&repo.Value, l.runner) {
		// The owner took this runner out of landers since the batch was
		// built: nothing is pushed, and the queue ejects its pulls.
		return l.void(ctx, b, "this runner is no longer among the repository's landers; its pulls go back to the queue", log)
	}
	if err := l.resquash(ctx, m, b); err != nil {
		return l.void(ctx, b, "cannot build the batch again: "+err.Error(), log)
	}
	ev := batchEvent(repo, b)
	if err := l.p.Intake.Consider(ctx, ev); err != nil {
		return fmt.Errorf("start the batch's checks: %w", err)
	}
	wfs, _, err := m.Workflows(ctx, v.Squashed)
	if err != nil {
		return err
	}
	verdict, detail := l.verdict(ev, wfs)
	switch verdict {
	case checks.Waiting, checks.Unknown:
		return nil
	case checks.Failed:
		v.Status, v.Error = forge.BatchFailed, checks.Truncate(detail, checks.MaxError)
		if _, err := l.p.Records.Put(ctx, forge.CollectionBatch, b.URI.RecordKey().String(), v); err != nil {
			return fmt.Errorf("write batch: %w", err)
		}
		pcs := make([]mergequeue.PullCommit, len(v.Pulls))
		for i, p := range v.Pulls {
			pcs[i] = mergequeue.PullCommit(p)
		}
		var ej *mergequeue.Ejection
		mem.Bisect, ej = mem.Bisect.Failed(pcs, detail)
		log.Info("batch failed", "detail", detail, "pulls", len(pcs))
		if ej != nil {
			ej.Detail = "fails in a batch on the base branch: " + ej.Detail
			if err := l.eject(ctx, uri, *ej, b.URI.String(), log); err != nil {
				return err
			}
		}
		l.p.Wake()
		return l.saveLanderMemory(uri, *mem)
	}
	// A pull whose head moved (or that closed) while its batch ran leaves
	// the queue: the batch is built again without it.
	if why, err := l.pullsStill(ctx, v); err != nil {
		return err
	} else if why != "" {
		return l.void(ctx, b, why, log)
	}
	err = m.Push(ctx, repo.Value.Source, branch, v.Base, v.Squashed)
	if errors.Is(err, mirror.ErrBaseMoved) {
		return l.void(ctx, b, err.Error()+"; its pulls go back to the queue", log)
	}
	if err != nil {
		return err
	}
	log.Info("batch pushed", "ref", v.Ref, "old", v.Base, "new", v.Squashed)
	return l.landed(ctx, b, mem, log)
}

// pullsStill says why a batch may not land because one of its pulls is
// no longer open at its approved commit, or targets another base than
// the batch's ("" when all are as approved).
func (l *Lander) pullsStill(ctx context.Context, v forge.Batch) (string, error) {
	for _, bp := range v.Pulls {
		p, err := l.p.Records.Pull(ctx, syntax.ATURI(bp.Pull))
		switch {
		case errors.Is(err, pdsclient.ErrNotFound):
			return "the pull " + bp.Pull + " is gone", nil
		case err != nil:
			return "", fmt.Errorf("read a pull of the batch: %w", err)
		case p.State != forge.PullOpen:
			return "the pull " + bp.Pull + " is no longer open", nil
		case p.Head.Commit != bp.Commit:
			return "the head of the pull " + bp.Pull + " moved from the approved " + bp.Commit, nil
		case "refs/heads/"+p.Base != v.Ref:
			return "the base of the pull " + bp.Pull + " changed after queueing, from " + v.Ref + " to " + p.Base, nil
		}
	}
	return "", nil
}

// resquash makes sure the batch's squashed commit is in the mirror (a
// cache wiped since it was built), building it again from the record.
func (l *Lander) resquash(ctx context.Context, m job.Repo, b forge.Record[forge.Batch]) error {
	if m.Has(ctx, b.Value.Squashed) {
		return nil
	}
	v := b.Value
	pulls := map[string]forge.Pull{}
	qs := make([]mergequeue.Queued, len(v.Pulls))
	for i, bp := range v.Pulls {
		p, err := l.p.Records.Pull(ctx, syntax.ATURI(bp.Pull))
		if err != nil {
			return err
		}
		p.Head.Commit = bp.Commit
		pulls[bp.Pull] = p
		qs[i] = mergequeue.Queued{PullCommit: mergequeue.PullCommit(bp), Base: strings.TrimPrefix(v.Ref, "refs/heads/")}
	}
	tip, _, err := l.squash(ctx, m, v.Base, qs, pulls, v.CreatedAt)
	if err != nil {
		return err
	}
	if tip != v.Squashed {
		return fmt.Errorf("squashed again to %s, not %s", tip, v.Squashed)
	}
	return nil
}

// void marks a batch rebuilt: its pulls go back to the queue.
func (l *Lander) void(ctx context.Context, b forge.Record[forge.Batch], why string, log *slog.Logger) error {
	v := b.Value
	v.Status, v.Error = forge.BatchRebuilt, checks.Truncate(why, checks.MaxError)
	if _, err := l.p.Records.Put(ctx, forge.CollectionBatch, b.URI.RecordKey().String(), v); err != nil {
		return fmt.Errorf("write batch: %w", err)
	}
	log.Info("batch void; it is built again", "why", why)
	l.p.Wake()
	return nil
}

// landed writes the landing of a pushed batch and marks the batch
// landed; both are keyed by the batch, so writing them again after a
// crash gives no second landing.
func (l *Lander) landed(ctx context.Context, b forge.Record[forge.Batch], mem *landerMemory, log *slog.Logger) error {
	v := b.Value
	key, err := forge.LandingKey(b.URI.RecordKey().String(), v.CreatedAt)
	if err != nil {
		return err
	}
	rec := forge.Landing{Type: forge.CollectionLanding, Repo: v.Repo, Ref: v.Ref, Old: v.Base, New: v.Squashed, Batch: b.URI.String(), CreatedAt: forge.Now()}
	if _, err := l.p.Records.Put(ctx, forge.CollectionLanding, key, rec); err != nil {
		return fmt.Errorf("write landing: %w", err)
	}
	v.Status = forge.BatchLanded
	if _, err := l.p.Records.Put(ctx, forge.CollectionBatch, b.URI.RecordKey().String(), v); err != nil {
		return fmt.Errorf("write batch: %w", err)
	}
	pcs := make([]mergequeue.PullCommit, len(v.Pulls))
	for i, p := range v.Pulls {
		pcs[i] = mergequeue.PullCommit(p)
	}
	mem.Bisect = mem.Bisect.Landed(pcs)
	log.Info("batch landed", "ref", v.Ref, "new", v.Squashed, "pulls", len(pcs))
	if l.p.Observer != nil {
		l.p.Observer.Landed(v.Repo, len(pcs))
	}
	l.p.Wake()
	return l.saveLanderMemory(v.Repo, *mem)
}

func (l *Lander) landerMemory(repo string) landerMemory {
	var m landerMemory
	if raw := l.p.State.Lander(repo); raw != nil {
		_ = json.Unmarshal(raw, &m) // unreadable: start without a bisection
	}
	return m
}

func (l *Lander) saveLanderMemory(repo string, m landerMemory) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return l.p.State.SetLander(repo, raw)
}
