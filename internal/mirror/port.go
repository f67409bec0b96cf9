package mirror

import (
	"context"

	"knotless.dev/run/internal/rules/job"
)

var _ job.Mirrors = Port{}

// Port is Mirrors as the parts' git port, job.Mirrors: job's values
// become mirror's, and a push offers the credentials the port was made
// with (only the lander's are given any).
type Port struct {
	m     *Mirrors
	creds PushCredentials
}

// Port returns the mirrors as job.Mirrors, their pushes offering creds.
func (m *Mirrors) Port(creds PushCredentials) Port {
	return Port{m: m, creds: creds}
}

// Open opens the mirror of key as a job.Repo.
func (p Port) Open(ctx context.Context, key string) (job.Repo, error) {
	r, err := p.m.Open(ctx, key)
	if err != nil {
		return nil, err
	}
	return portRepo{r, p.creds}, nil
}

// portRepo is a Repo as a job.Repo.
type portRepo struct {
	*Repo
	creds PushCredentials
}

func (r portRepo) Fetch(ctx context.Context, origin job.Origin, source, ref, commit string) error {
	o := Owner
	if origin == job.PullSource {
		o = Pull
	}
	return r.Repo.Fetch(ctx, o, source, ref, commit)
}

func (r portRepo) Push(ctx context.Context, source, branch, old, new string) error {
	return r.Repo.Push(ctx, source, branch, old, new, r.creds)
}
