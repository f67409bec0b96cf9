package appliance_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/dockerd"
)

// dockerSocket is where the machine finds the private dockerd's socket.
const dockerSocket = "/srv/knotless-docker.sock"

// TestRollbackToDocker: the module's Kubernetes runner hands a run over
// mid-step at a stop, and the operator moves it to the Docker executor
// (the module's docker unit, settings changed, the old kubeconfig kept)
// and starts it: the successor, which cannot adopt a Kubernetes session,
// stops the old Job before READY=1, and only then runs the work again,
// on the private dockerd, under the same check. Before issue 35 it ran
// the work again while the Job went on: two copies at once. The
// successor warns, once, of the workflow whose image the Docker daemon
// cannot find, and that workflow's run ends error at once naming it.
// The journal of both processes has no error line, and client-go's
// lines (a debug runner; the API server's warning of the run's Job) are
// journal entries with their fields and priority, not text on stderr.
func TestRollbackToDocker(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	d := dockerd.Start(t)
	w := newWorld(t)
	k := bootKubeWith(t, c, w, map[string]any{"log-level": "debug"},
		[]string{strings.TrimPrefix(d.Host(), "unix://") + ":" + dockerSocket})
	// The API server warns of the run's Job: client-go logs a warning it
	// gets, so the journal has one client-go line whatever the timing
	// (a stream closed at the handover gives one only now and then).
	const apiWarning = "knotless test: the API server warns of every Job here"
	c.WarnOnJobCreate(t, k.ns, apiWarning)

	// On Kubernetes the step runs as UID 1000 and waits; on Docker, as
	// root, it goes straight on.
	// A second workflow names an image in a registry nobody answers for
	// (no DNS query): it waits in the queue behind the first.
	const absent = "127.0.0.1:1/knotless/absent:1"
	commit := w.push(map[string]string{".knotless/workflows/long.yaml": `
on: [push]
steps:
  - name: long
    run: |
      echo "step as $(id -u)"
      touch "$KNOTLESS_RUN_WORK/step-started"
      if [ "$(id -u)" = 1000 ]; then sleep 600; fi
      echo done
`, ".knotless/workflows/absent.yaml": "on: [push]\nimage: " + absent + "\nsteps: [{run: 'echo never'}]\n"})
	w.waitCheck("long", commit, 3*time.Minute, running)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.WaitForCommand(ctx, k.ns, k.selector(), "run", []string{"test", "-e", "/work/step-started"}); err != nil {
		t.Fatalf("the step did not start: %v", err)
	}
	oldPID := k.show(service, "MainPID")
	if out, err := k.systemctl("stop", service); err != nil {
		t.Fatalf("systemctl stop: %v\n%s", err, out)
	}
	if e := find(k.journal(service), "handed over 1 runs"); len(e) != 1 || e[0]["GOING_ON"] != "1" {
		t.Fatalf("want the run handed over, going on in its Job; got %v", e)
	}
	if jobs, pods := k.jobsAndPods(); jobs != 1 || pods != 1 {
		t.Fatalf("after the handover the runner has %d Jobs and %d pods, want the run's", jobs, pods)
	}

	// The operator's change: the module's docker unit (its group, the
	// daemon's socket) and executor = "docker"; the kubeconfig setting
	// stays, so the successor can reach what its predecessor left.
	k.sh(`systemctl mask docker.service docker.socket containerd.service`)
	k.sh(`echo "g docker -" > /etc/sysusers.d/docker.conf && systemd-sysusers && chgrp docker "$1" && chmod 0660 "$1"`, dockerSocket)
	dockerUnit := strings.ReplaceAll(unit(t, "knotless-run.docker.service"), docsRepo, w.Owner.DID.String()+"/hello")
	if err := os.WriteFile(filepath.Join(k.UnitsDir(), service), []byte(dockerUnit), 0o644); err != nil {
		t.Fatal(err)
	}
	settings := w.settings(map[string]any{
		"executor":    "docker",
		"docker-host": "unix://" + dockerSocket,
		"image":       d.Image(),
		"kubeconfig":  "/var/lib/knotless/kubeconfig",
		"namespace":   k.ns,
		"discover":    false,
	})
	if err := os.WriteFile(filepath.Join(k.OptDir(), "knotless-run.json"), settings, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := k.systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
	if out, err := k.systemctl("start", service); err != nil {
		t.Fatalf("systemctl start on docker: %v\n%s", err, out)
	}
	// READY=1: the successor has dealt with the handed-over run; it
	// starts work only now.
	if jobs, pods := k.jobsAndPods(); jobs != 0 || pods != 0 {
		t.Errorf("the docker successor is ready while the handed-over run goes on in the cluster (%d Jobs, %d pods): its work would run twice at once", jobs, pods)
	}

	got := w.waitCheck("long", commit, 3*time.Minute, final)
	if got.Status != "success" {
		t.Fatalf("the run on docker: %s (%s)", got.Status, got.Error)
	}
	if blob := w.blob(t, got); !strings.Contains(blob, "step as 0\n") || !strings.Contains(blob, "\ndone\n") {
		t.Errorf("the check's log is not the docker run's:\n%s", blob)
	}
	if got := w.waitCheck("absent", commit, 3*time.Minute, final); got.Status != "error" ||
		!strings.Contains(got.Error, "workflow absent") || !strings.Contains(got.Error, "image "+absent) {
		t.Errorf("the run of an image nobody serves: %s (%s), want error naming the workflow and the image", got.Status, got.Error)
	}
	journal := k.journal(service)
	if e := find(journal, "cannot find the image"); len(e) != 1 || e[0]["IMAGE"] != absent || e[0]["WORKFLOW"] != "absent" ||
		!strings.HasSuffix(e[0]["REPO"], "/hello") || e[0]["PRIORITY"] != "4" {
		t.Errorf("want one warning naming the image %s, the workflow absent and the repository; got %v", absent, e)
	}
	newPID := k.show(service, "MainPID")
	stopped, started := -1, -1
	for i, e := range journal {
		if e["_PID"] != newPID {
			continue
		}
		if stopped < 0 && strings.Contains(e["MESSAGE"], "stopped the session of a run handed over on another executor") && e["FROM"] == "kubernetes" && e["EXECUTOR"] == "docker" {
			stopped = i
		}
		if started < 0 && strings.Contains(e["MESSAGE"], "run started") {
			started = i
		}
	}
	if stopped < 0 || started < stopped {
		t.Errorf("the docker successor (PID %s, was %s) did not say it stopped the Kubernetes session before it started the run again (entries %d, %d)", newPID, oldPID, stopped, started)
	}
	if !k.waitNoRunObjects(time.Minute) {
		t.Error("the rollback left the runner's Job or pod in the cluster")
	}
	cli, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// The final check is written before the run's container is removed,
	// so wait for the removal, bounded.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		left, err := cli.ContainerList(context.Background(), client.ContainerListOptions{All: true,
			Filters: client.Filters{}.Add("label", executor.LabelRunner+"="+executor.RunnerLabel(w.Runner.DID.String()))})
		if err != nil {
			t.Fatal(err)
		}
		if len(left.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("a minute after its check, the docker run left %d containers", len(left.Items))
			break
		}
	}

	// A clean handover and a clean rollback: no error line. client-go's
	// lines are the journal's own entries, at their priority.
	warned := 0
	for _, e := range journal {
		if p := e["PRIORITY"]; p == "0" || p == "1" || p == "2" || p == "3" || strings.Contains(e["MESSAGE"], "level=error") {
			t.Errorf("an error line in the journal (PID %s, PRIORITY %s): %s", e["_PID"], p, e["MESSAGE"])
		}
		if strings.Contains(e["MESSAGE"], "component=client-go") {
			t.Errorf("a client-go line reached the journal as text on stderr (PRIORITY %s): %s", e["PRIORITY"], e["MESSAGE"])
		}
		if e["COMPONENT"] == "client-go" && strings.Contains(e["MESSAGE"], apiWarning) && e["PRIORITY"] == "6" {
			warned++
		}
	}
	if warned == 0 {
		t.Errorf("the API server's warning of the run's Job is not in the journal as a client-go entry with its fields (COMPONENT=client-go, PRIORITY=6, MESSAGE naming %q)", apiWarning)
	}
}
