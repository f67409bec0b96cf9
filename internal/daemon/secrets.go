package daemon

import (
	"context"
	"fmt"

	"knotless.dev/run/internal/forge"
)

// secrets returns the values a trusted run of j may be granted: the
// repository's sealed secrets opened with the runner's key, then the
// operator's secrets, which take precedence.
func (d *Daemon) secrets(ctx context.Context, j *job) (map[string]string, error) {
	out := map[string]string{}
	if len(j.wf.Secrets) > 0 {
		recs, bad, err := forge.List[forge.Secret](ctx, d.reader, j.ev.Owner(), forge.CollectionSecret)
		if err != nil {
			return nil, fmt.Errorf("read sealed secrets: %w", err)
		}
		for _, b := range bad {
			d.log.Warn("secret record does not match its lexicon; ignored", "uri", b.URI.String(), "err", b.Err)
		}
		for _, r := range recs {
			s := r.Value
			if s.Repo != j.ev.Repo.URI.String() || s.Runner != d.cfg.Runner.String() || s.Scope != forge.ScopePush {
				continue
			}
			v, err := d.key.Open(s.Sealed)
			if err != nil {
				d.log.Warn("sealed secret does not open with this runner's key; ignored", "uri", r.URI.String(), "name", s.Name, "err", err)
				continue
			}
			out[s.Name] = string(v)
		}
	}
	for k, v := range d.cfg.Secrets {
		out[k] = v
	}
	return out, nil
}
