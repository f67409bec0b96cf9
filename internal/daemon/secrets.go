package daemon

import (
	"context"
	"fmt"
	"slices"
)

// secrets returns the values a trusted run of j may be granted: the
// repository's sealed secrets opened with the runner's key, then the
// operator's secrets scoped to this run, which take precedence.
func (d *Daemon) secrets(ctx context.Context, j *job) (map[string]string, error) {
	out := map[string]string{}
	if len(j.wf.Secrets) > 0 {
		recs, bad, err := d.sealed.Secrets(ctx, j.ev.Owner())
		if err != nil {
			return nil, fmt.Errorf("read sealed secrets: %w", err)
		}
		for _, b := range bad {
			d.log.Warn("secret record does not match its lexicon; ignored", "uri", b.URI.String(), "err", b.Err)
		}
		repo, runner := j.ev.Repo.URI.String(), d.cfg.Runner.String()
		for _, r := range recs {
			s := r.Value
			if s.Repo != repo || s.Runner != runner || !slices.Contains(j.wf.Secrets, s.Name) {
				continue // another repository's, another runner's, or not granted
			}
			// The record's fields are whatever its writer put there; only
			// the sealed envelope says which repository, name, runner and
			// scope the value is for (a copy of another repository's
			// sealed bytes is refused here).
			v, err := d.key.OpenSecret(s, repo, runner)
			if err != nil {
				d.log.Warn("sealed secret refused; withheld", "name", s.Name, "uri", r.URI.String(), "repo", repo, "err", err)
				continue
			}
			out[s.Name] = string(v)
		}
	}
	// The operator's secrets for this run: its repository, workflow and
	// ref. The first in the file's order wins.
	given := map[string]bool{}
	for _, s := range d.cfg.Secrets {
		if given[s.Name] || !slices.Contains(j.wf.Secrets, s.Name) || !s.For(j.ev.Repo.URI.String(), j.wf.Name, j.ev.Ref) {
			continue
		}
		given[s.Name] = true
		out[s.Name] = s.Value
	}
	return out, nil
}
