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
// forge.Account, forge.Reader); the rules' tests fill them with
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
	Push(ctx context.Context, source, branch, old, new string, cred mirror.Credential) error
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
