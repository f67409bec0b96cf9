package scheduler

import (
	"context"
	"fmt"
	"slices"

	"knotless.dev/run/internal/rules/job"
)

// AnyRepo in OperatorSecret.Repos makes a secret unscoped: every
// repository the runner serves may be granted it.
const AnyRepo = "*"

// OperatorSecret is one secret of the operator's secrets file and the
// runs it is for.
type OperatorSecret struct {
	Name  string
	Value string
	// Repos are the AT-URIs (at://DID/dev.knotless.repo/NAME) of the
	// repositories whose runs may be granted it, or AnyRepo alone.
	Repos []string
	// Workflows, when set, are the workflow names it is for; Refs, when
	// set, the full ref names (refs/heads/main).
	Workflows []string
	Refs      []string
}

// Unscoped reports whether the secret is for every repository.
func (s OperatorSecret) Unscoped() bool { return slices.Contains(s.Repos, AnyRepo) }

// For reports whether a trusted run of workflow on ref of repo may be
// granted the secret.
func (s OperatorSecret) For(repo, workflow, ref string) bool {
	if !s.Unscoped() && !slices.Contains(s.Repos, repo) {
		return false
	}
	if len(s.Workflows) > 0 && !slices.Contains(s.Workflows, workflow) {
		return false
	}
	if len(s.Refs) > 0 && !slices.Contains(s.Refs, ref) {
		return false
	}
	return true
}

// secrets returns the values a trusted run of j may be granted: the
// repository's sealed secrets opened with the runner's key, then the
// operator's secrets scoped to this run, which take precedence.
func (s *Scheduler) secrets(ctx context.Context, j *job.Job) (map[string]string, error) {
	out := map[string]string{}
	if len(j.Workflow.Secrets) > 0 {
		recs, bad, err := s.p.Sealed.Secrets(ctx, j.Event.Owner())
		if err != nil {
			return nil, fmt.Errorf("read sealed secrets: %w", err)
		}
		for _, b := range bad {
			s.log.Warn("secret record does not match its lexicon; ignored", "uri", b.URI.String(), "err", b.Err)
		}
		repo, runner := j.Event.Repo.URI.String(), s.facts.Runner.String()
		for _, r := range recs {
			sec := r.Value
			if sec.Repo != repo || sec.Runner != runner || !slices.Contains(j.Workflow.Secrets, sec.Name) {
				continue // another repository's, another runner's, or not granted
			}
			// The record's fields are whatever its writer put there; only
			// the sealed envelope says which repository, name, runner and
			// scope the value is for (a copy of another repository's
			// sealed bytes is refused here).
			v, err := s.p.Key.OpenSecret(sec, repo, runner)
			if err != nil {
				s.log.Warn("sealed secret refused; withheld", "name", sec.Name, "uri", r.URI.String(), "repo", repo, "err", err)
				continue
			}
			out[sec.Name] = string(v)
		}
	}
	// The operator's secrets for this run: its repository, workflow and
	// ref. The first in the file's order wins.
	given := map[string]bool{}
	for _, o := range s.cfg.Secrets {
		if given[o.Name] || !slices.Contains(j.Workflow.Secrets, o.Name) || !o.For(j.Event.Repo.URI.String(), j.Workflow.FileName(), j.Event.Ref) {
			continue
		}
		given[o.Name] = true
		out[o.Name] = o.Value
	}
	return out, nil
}
