package daemon

import (
	"context"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/job"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/pdsclient"
)

// The real things behind the parts' ports that are not already the
// right shape: the mirrors as job.Mirrors, the sealed secrets and the
// merge queue's records through the reader and the runner's account.

// gitMirrors is mirror.Mirrors as job.Mirrors. Its pushes offer creds,
// which only the lander's mirrors are given.
type gitMirrors struct {
	m     *mirror.Mirrors
	creds mirror.PushCredentials
}

func (m gitMirrors) Open(ctx context.Context, key string) (job.Repo, error) {
	r, err := m.m.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	return gitRepo{r, m.creds}, nil
}

// gitRepo is a mirror.Repo as a job.Repo: job's values are mirror's.
type gitRepo struct {
	*mirror.Repo
	creds mirror.PushCredentials
}

func (r gitRepo) Fetch(ctx context.Context, origin job.Origin, source, ref, commit string) error {
	o := mirror.Owner
	if origin == job.PullSource {
		o = mirror.Pull
	}
	return r.Repo.Fetch(ctx, o, source, ref, commit)
}

func (r gitRepo) Squash(ctx context.Context, base string, pulls []job.SquashPull, who job.Identity, at time.Time) (string, []job.Squashed, error) {
	ps := make([]mirror.SquashPull, len(pulls))
	for i, p := range pulls {
		ps[i] = mirror.SquashPull(p)
	}
	tip, squashed, err := r.Repo.Squash(ctx, base, ps, mirror.Identity(who), at)
	out := make([]job.Squashed, len(squashed))
	for i, s := range squashed {
		out[i] = job.Squashed(s)
	}
	return tip, out, err
}

func (r gitRepo) Push(ctx context.Context, source, branch, old, new string) error {
	return r.Repo.Push(ctx, source, branch, old, new, r.creds)
}

// secretReader lists sealed secrets with a pdsclient.Reader.
type secretReader struct{ r *pdsclient.Reader }

func (s secretReader) Secrets(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.Secret], []forge.Invalid, error) {
	return pdsclient.List[forge.Secret](ctx, s.r, owner, forge.CollectionSecret)
}

// queueForge reads the queue with a pdsclient.Reader and keeps the lander's
// records in its pdsclient.Account.
type queueForge struct {
	r *pdsclient.Reader
	a *pdsclient.Account
}

func (q queueForge) Entries(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.QueueEntry], []forge.Invalid, error) {
	return pdsclient.List[forge.QueueEntry](ctx, q.r, owner, forge.CollectionQueueEntry)
}

func (q queueForge) Pull(ctx context.Context, uri syntax.ATURI) (forge.Pull, error) {
	var p forge.Pull
	_, err := q.r.Get(ctx, uri, &p)
	return p, err
}

func (q queueForge) Batches(ctx context.Context) ([]forge.Record[forge.Batch], []forge.Invalid, error) {
	return pdsclient.ListOwn[forge.Batch](ctx, q.a, forge.CollectionBatch)
}

func (q queueForge) Ejections(ctx context.Context) ([]forge.Record[forge.Ejection], []forge.Invalid, error) {
	return pdsclient.ListOwn[forge.Ejection](ctx, q.a, forge.CollectionEjection)
}

func (q queueForge) Put(ctx context.Context, collection, rkey string, v any) (syntax.ATURI, error) {
	return q.a.Put(ctx, collection, rkey, v)
}
