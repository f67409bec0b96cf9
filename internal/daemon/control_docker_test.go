package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/docker"
	"knotless.dev/run/tests/dockerd"
)

// dockerObjects lists the containers and networks of the world's
// runner's runs on d.
func dockerObjects(t *testing.T, d *dockerd.Daemon, w *world) []string {
	t.Helper()
	cli, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	f := client.Filters{}.Add("label", docker.LabelRunner+"="+executor.RunnerLabel(w.Runner.DID.String()))
	var out []string
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs.Items {
		out = append(out, "container "+strings.Join(c.Names, ","))
	}
	ns, err := cli.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns.Items {
		out = append(out, "network "+n.Name)
	}
	return out
}

// TestServeCancelOnDocker: the owner's cancel record stops a check
// running in a container on a private dockerd: it ends cancelled naming
// the record, and the run's container and network are gone.
func TestServeCancelOnDocker(t *testing.T) {
	t.Parallel()
	needPDS(t)
	d := dockerd.Start(t)
	w := newWorld(t)
	_, commit := w.Push(map[string]string{".knotless/workflows/slow.yaml": workflowFile(`
on: [push]
steps:
  - name: slow
    run: echo started; sleep 300
`)})
	w.start(w.config(controlled, func(c *daemon.Config) {
		ex, err := docker.New(docker.Config{Host: d.Host(), Runner: w.Runner.DID.String(), Logger: c.Logger})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ex.Close() })
		c.Engine.Executor, c.Engine.DefaultImage = ex, d.Image()
	}))
	key := w.checkOf("slow", commit, "running", 3*time.Minute)
	w.waitLog(`msg="step started"`, 3*time.Minute)
	if len(dockerObjects(t, d, w)) == 0 {
		t.Fatal("no container of the running check")
	}
	by := w.cancel(w.Owner, key)
	_, got := w.waitFinal("slow", commit, 2*time.Minute)
	if got.Status != "cancelled" || got.CancelledBy != by.String() {
		t.Errorf("check: %s by %q (%q)", got.Status, got.CancelledBy, got.Error)
	}
	waitGone(t, "on the docker daemon", func() []string { return dockerObjects(t, d, w) })
	if m := stoppedIn.FindStringSubmatch(w.logText()); m != nil {
		t.Logf("cancel: the run stopped in %s after the record was read (docker executor: its container and network removed)", m[1])
	} else {
		t.Error("no figure of the cancel logged")
	}
}
