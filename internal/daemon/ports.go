package daemon

import (
	"context"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/ingest"
	"knotless.dev/run/internal/mirror"
	"knotless.dev/run/internal/workflow"
)

// The daemon's ports: the narrow part of each outside thing it uses.
// start fills them with the real ones (ingest.Lister, mirror.Mirrors,
// forge.Account, forge.Reader, queueForge); the rules' tests fill them with
// in-memory fakes. Check records go through checks.Writer, sessions
// through executor.Executor.

// intake is where work comes from: the listing of the watched
// repositories' records (ingest.Lister), told of the changes the event
// streams saw.
type intake interface {
	Reconcile(ctx context.Context) (*ingest.Snapshot, error)
	Changed(c ingest.Change)
}

// mirrorSet opens the git mirror of a key (mirrorKey).
type mirrorSet interface {
	Open(ctx context.Context, key string) (gitRepo, error)
}

// gitRepo is one mirror (mirror.Repo): fetch an event's commit, merge a
// pull, read the workflows of a tree and export it for a run; for the
// merge queue's lander, squash a batch and push it with a lease.
type gitRepo interface {
	Fetch(ctx context.Context, origin mirror.Origin, source, ref, commit string) error
	Branch(ctx context.Context, source, branch string) (string, error)
	Merge(ctx context.Context, base, head string) (string, error)
	Workflows(ctx context.Context, treeish string) ([]*workflow.Workflow, []error, error)
	Export(ctx context.Context, treeish, dir string) error
	Squash(ctx context.Context, base string, pulls []mirror.SquashPull, who mirror.Identity, at time.Time) (string, []mirror.Squashed, error)
	Push(ctx context.Context, source, branch, old, new string, creds mirror.PushCredentials) error
	Has(ctx context.Context, commit string) bool
}

// blobStore takes a run's log and image outputs (forge.Account).
type blobStore interface {
	UploadBlob(ctx context.Context, mimeType string, data []byte) (atdata.Blob, error)
}

// sealedSecrets lists a repository owner's sealed secret records.
type sealedSecrets interface {
	Secrets(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.Secret], []forge.Invalid, error)
}

// queueRecords are the merge queue's records, all the lander reads and
// writes besides checks (queueForge): the owner's queue entries, the
// queued pulls, and the lander's own batches, ejections and landings.
type queueRecords interface {
	Entries(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.QueueEntry], []forge.Invalid, error)
	// Pull reads a pull record; forge.ErrNotFound when it is gone.
	Pull(ctx context.Context, uri syntax.ATURI) (forge.Pull, error)
	Batches(ctx context.Context) ([]forge.Record[forge.Batch], []forge.Invalid, error)
	Ejections(ctx context.Context) ([]forge.Record[forge.Ejection], []forge.Invalid, error)
	// Put writes one of the lander's own records (a batch, an ejection
	// or a landing).
	Put(ctx context.Context, collection, rkey string, v any) (syntax.ATURI, error)
}

// mirrors is mirror.Mirrors as a mirrorSet.
type mirrors struct{ m *mirror.Mirrors }

func (m mirrors) Open(ctx context.Context, key string) (gitRepo, error) {
	r, err := m.m.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// secretReader lists sealed secrets with a forge.Reader.
type secretReader struct{ r *forge.Reader }

func (s secretReader) Secrets(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.Secret], []forge.Invalid, error) {
	return forge.List[forge.Secret](ctx, s.r, owner, forge.CollectionSecret)
}

// queueForge reads the queue with a forge.Reader and keeps the lander's
// records in its forge.Account.
type queueForge struct {
	r *forge.Reader
	a *forge.Account
}

func (q queueForge) Entries(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.QueueEntry], []forge.Invalid, error) {
	return forge.List[forge.QueueEntry](ctx, q.r, owner, forge.CollectionQueueEntry)
}

func (q queueForge) Pull(ctx context.Context, uri syntax.ATURI) (forge.Pull, error) {
	var p forge.Pull
	_, err := q.r.Get(ctx, uri, &p)
	return p, err
}

func (q queueForge) Batches(ctx context.Context) ([]forge.Record[forge.Batch], []forge.Invalid, error) {
	return forge.ListOwn[forge.Batch](ctx, q.a, forge.CollectionBatch)
}

func (q queueForge) Ejections(ctx context.Context) ([]forge.Record[forge.Ejection], []forge.Invalid, error) {
	return forge.ListOwn[forge.Ejection](ctx, q.a, forge.CollectionEjection)
}

func (q queueForge) Put(ctx context.Context, collection, rkey string, v any) (syntax.ATURI, error) {
	return q.a.Put(ctx, collection, rkey, v)
}
