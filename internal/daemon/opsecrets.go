package daemon

import (
	"fmt"
	"slices"
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

// checkOperatorSecrets refuses an unscoped operator secret when the
// runner discovers its repositories: any account could then name the
// runner and ask for it.
func checkOperatorSecrets(secrets []OperatorSecret, discover bool) error {
	for _, s := range secrets {
		if len(s.Repos) == 0 {
			return fmt.Errorf("operator secret %s names no repository", s.Name)
		}
		if discover && s.Unscoped() {
			return fmt.Errorf("operator secret %s is for every repository, and discovery serves any repository that names this runner: scope it to repositories", s.Name)
		}
	}
	return nil
}
