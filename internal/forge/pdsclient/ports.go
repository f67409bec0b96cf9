package pdsclient

import (
	"context"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
)

// Secrets lists the sealed secrets owner wrote (the scheduler's Sealed
// port).
func (r *Reader) Secrets(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.Secret], []forge.Invalid, error) {
	return List[forge.Secret](ctx, r, owner, forge.CollectionSecret)
}

// Queue is the merge queue's records as the lander reads and keeps
// them (its Records port): the owners' entries and pulls read with the
// Reader, the lander's own batches and ejections in the Account.
type Queue struct {
	Reader  *Reader
	Account *Account
}

// Entries lists the queue entries owner wrote.
func (q Queue) Entries(ctx context.Context, owner syntax.DID) ([]forge.Record[forge.QueueEntry], []forge.Invalid, error) {
	return List[forge.QueueEntry](ctx, q.Reader, owner, forge.CollectionQueueEntry)
}

// Pull reads the pull at uri.
func (q Queue) Pull(ctx context.Context, uri syntax.ATURI) (forge.Pull, error) {
	var p forge.Pull
	_, err := q.Reader.Get(ctx, uri, &p)
	return p, err
}

// Batches lists the runner's batch records.
func (q Queue) Batches(ctx context.Context) ([]forge.Record[forge.Batch], []forge.Invalid, error) {
	return ListOwn[forge.Batch](ctx, q.Account, forge.CollectionBatch)
}

// Ejections lists the runner's ejection records.
func (q Queue) Ejections(ctx context.Context) ([]forge.Record[forge.Ejection], []forge.Invalid, error) {
	return ListOwn[forge.Ejection](ctx, q.Account, forge.CollectionEjection)
}

// Put writes one of the runner's records.
func (q Queue) Put(ctx context.Context, collection, rkey string, v any) (syntax.ATURI, error) {
	return q.Account.Put(ctx, collection, rkey, v)
}
