package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/ingest"
	"knotless.dev/run/internal/parts/scheduler"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/tests/gitrepo"
	"knotless.dev/run/tests/pds"
)

// neighbour is a second owner whose repository names the same runner as
// a world's: the other tenant of a shared runner.
type neighbour struct {
	owner   *pds.Account
	repoURI syntax.ATURI
	src     *gitrepo.Repo
}

func (w *world) neighbour() *neighbour {
	w.t.Helper()
	owner, err := srv.CreateAccount(context.Background(), "tenant")
	if err != nil {
		w.t.Fatal(err)
	}
	n := &neighbour{owner: owner, repoURI: forge.RepoURI(owner.DID, "hello"), src: gitrepo.New(w.t)}
	w.Put(owner, forge.CollectionRepo, "hello", forge.Repo{
		Type: forge.CollectionRepo, Name: "hello", Source: "file://" + n.src.Dir, DefaultBranch: "main",
		Runners: []string{w.Runner.DID.String()}, CreatedAt: forge.Now(),
	})
	return n
}

// push commits files on the neighbour's main and writes its refUpdate.
func (n *neighbour) push(w *world, files map[string]string) string {
	w.t.Helper()
	commit := n.src.Commit("main", files)
	w.Put(n.owner, forge.CollectionRefUpdate, "", forge.RefUpdate{
		Type: forge.CollectionRefUpdate, Repo: n.repoURI.String(), Ref: "refs/heads/main", New: commit, CreatedAt: forge.Now(),
	})
	return commit
}

func (n *neighbour) target() ingest.Target {
	return ingest.Target{Owner: syntax.AtIdentifier(n.owner.DID), Name: "hello"}
}

// tenantWorkflow grants one secret and says, without printing the
// value, whether it arrived as want.
func tenantWorkflow(who, secret, want string) map[string]string {
	return map[string]string{
		"who.txt": who + "\n", // distinct commits in the two repositories
		".knotless/workflows/deploy.yaml": workflowFile(`
on: [push]
secrets: [` + secret + `]
steps:
  - name: use
    secrets: [` + secret + `]
    run: test "$` + secret + `" = "` + want + `" && echo value-ok || echo value-absent
`),
	}
}

// runLog is the log blob of a final check, or "" when it has none.
func (w *world) runLog(c forge.Check) string {
	if c.Log == nil {
		return ""
	}
	return string(w.Blob(c.Log.Ref.String()))
}

// TestSealedSecretStaysWithItsRepository: owner A seals DEPLOY_TOKEN for
// its repository; owner B, whose repository names the same runner,
// copies A's public sealed bytes into a secret record of its own. B's
// push does not get the value (the refusal is logged with the secret's
// name and record); A's push still does.
func TestSealedSecretStaysWithItsRepository(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	b := w.neighbour()
	key, _, err := state.LoadKey(w.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := forge.SealSecret(key.Public, forge.Envelope{
		Repo: w.RepoURI.String(), Name: "DEPLOY_TOKEN", Runner: w.Runner.DID.String(), Scope: forge.ScopePush, Value: []byte("a-deploy-value"),
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Put(w.Owner, forge.CollectionSecret, "hello.DEPLOY_TOKEN", forge.Secret{
		Type: forge.CollectionSecret, Repo: w.RepoURI.String(), Name: "DEPLOY_TOKEN", Runner: w.Runner.DID.String(),
		Key: key.PublicString(), Scope: forge.ScopePush, Sealed: sealed, CreatedAt: forge.Now(),
	})
	// B's copy: every field of the record names B's repository; the
	// sealed bytes are A's, read from A's public record.
	copied := w.Put(b.owner, forge.CollectionSecret, "hello.DEPLOY_TOKEN", forge.Secret{
		Type: forge.CollectionSecret, Repo: b.repoURI.String(), Name: "DEPLOY_TOKEN", Runner: w.Runner.DID.String(),
		Key: key.PublicString(), Scope: forge.ScopePush, Sealed: sealed, CreatedAt: forge.Now(),
	})
	_, commitA := w.Push(tenantWorkflow("a", "DEPLOY_TOKEN", "a-deploy-value"))
	commitB := b.push(w, tenantWorkflow("b", "DEPLOY_TOKEN", "a-deploy-value"))

	w.start(w.config(func(c *daemon.Config) { c.Sources.Targets = append(c.Sources.Targets, b.target()) }))
	_, gotB := w.waitFinal("deploy", commitB, 90*time.Second)
	if log := w.runLog(gotB); strings.Contains(log, "value-ok") {
		t.Errorf("B's push got A's sealed value:\n%s", log)
	}
	if gotB.Status != "error" || !strings.Contains(gotB.Error, "DEPLOY_TOKEN") {
		t.Errorf("B's push: got %s %q, want an error naming DEPLOY_TOKEN", gotB.Status, gotB.Error)
	}
	if logs := w.logText(); !strings.Contains(logs, "name=DEPLOY_TOKEN") || !strings.Contains(logs, copied.String()) {
		t.Errorf("the daemon log does not name the refused secret DEPLOY_TOKEN of %s:\n%s", copied, logs)
	}
	_, gotA := w.waitFinal("deploy", commitA, 90*time.Second)
	if log := w.runLog(gotA); !strings.Contains(log, "value-ok") {
		t.Errorf("A's push: got %s (%s), want its own sealed value:\n%s", gotA.Status, gotA.Error, log)
	}
}

// TestOperatorSecretStaysWithItsRepository: an operator secret scoped to
// A's repository reaches A's push and not the push of B, another owner
// whose repository names the same runner.
func TestOperatorSecretStaysWithItsRepository(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	b := w.neighbour()
	_, commitA := w.Push(tenantWorkflow("a", "OPERATOR_TOKEN", "a-operator-value"))
	commitB := b.push(w, tenantWorkflow("b", "OPERATOR_TOKEN", "a-operator-value"))

	w.start(w.config(func(c *daemon.Config) {
		c.Sources.Targets = append(c.Sources.Targets, b.target())
		c.Scheduler.Secrets = []scheduler.OperatorSecret{{Name: "OPERATOR_TOKEN", Value: "a-operator-value", Repos: []string{w.RepoURI.String()}}}
	}))
	_, gotB := w.waitFinal("deploy", commitB, 90*time.Second)
	if log := w.runLog(gotB); strings.Contains(log, "value-ok") {
		t.Errorf("B's push got the operator secret scoped to A:\n%s", log)
	}
	_, gotA := w.waitFinal("deploy", commitA, 90*time.Second)
	if log := w.runLog(gotA); !strings.Contains(log, "value-ok") {
		t.Errorf("A's push: got %s (%s), want the operator secret:\n%s", gotA.Status, gotA.Error, log)
	}
}
