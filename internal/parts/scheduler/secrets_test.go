package scheduler

import (
	"testing"
)

// TestOperatorSecretFor: an operator secret reaches the runs of the
// repositories, workflows and refs it names, and no others.
func TestOperatorSecretFor(t *testing.T) {
	t.Parallel()
	const (
		a = "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/dev.knotless.repo/hello"
		b = "at://did:plc:vwzwgnygau7ed7b7wt5ux7y2/dev.knotless.repo/hello"
	)
	for _, c := range []struct {
		name                string
		s                   OperatorSecret
		repo, workflow, ref string
		want                bool
	}{
		{"its repository", OperatorSecret{Repos: []string{a}}, a, "deploy", "refs/heads/main", true},
		{"another owner's repository", OperatorSecret{Repos: []string{a}}, b, "deploy", "refs/heads/main", false},
		{"unscoped", OperatorSecret{Repos: []string{AnyRepo}}, b, "deploy", "refs/heads/main", true},
		{"no repository named", OperatorSecret{}, a, "deploy", "refs/heads/main", false},
		{"its workflow", OperatorSecret{Repos: []string{a}, Workflows: []string{"deploy"}}, a, "deploy", "refs/heads/main", true},
		{"another workflow", OperatorSecret{Repos: []string{a}, Workflows: []string{"deploy"}}, a, "test", "refs/heads/main", false},
		{"its ref", OperatorSecret{Repos: []string{a}, Refs: []string{"refs/heads/main"}}, a, "deploy", "refs/heads/main", true},
		{"another ref", OperatorSecret{Repos: []string{a}, Refs: []string{"refs/heads/main"}}, a, "deploy", "refs/heads/feature", false},
		{"a ref is matched whole", OperatorSecret{Repos: []string{a}, Refs: []string{"refs/heads/main"}}, a, "deploy", "refs/heads/main2", false},
	} {
		if got := c.s.For(c.repo, c.workflow, c.ref); got != c.want {
			t.Errorf("%s: For = %v, want %v", c.name, got, c.want)
		}
	}
}
