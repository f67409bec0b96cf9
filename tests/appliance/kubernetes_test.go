package appliance_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/tests/clustertest"
)

const (
	refreshService = "knotless-run-kubeconfig.service"
	refreshTimer   = "knotless-run-kubeconfig.timer"
	// From the module's configuration in docs/guide/nixos.md.
	runsNamespace = "knotless-runs"
	docsRepo      = "did:plc:ewvi7nxzyoun6zhxrhs64oiz/hello"
	secretValue   = "s3cret-deploy-7f1c"
)

// TestKubernetes: the module's Kubernetes runner under a real systemd,
// on the test cluster: the refresh oneshot mints the scoped kubeconfig
// from the admin credential (LoadCredential=), the daemon runs a
// workflow as a Job with it, the timer replaces the kubeconfig (0600)
// and the running daemon's next Job uses the new one with no restart;
// a restart mid-run hands the run over and the new process adopts it;
// no secret value reaches the journal.
func TestKubernetes(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	t.Cleanup(func() {
		_ = c.Clientset.CoreV1().Namespaces().Delete(context.Background(), runsNamespace, metav1.DeleteOptions{})
		// The refresh minted the runner's admission policy: cluster-scoped,
		// it outlives the namespace.
		if err := c.DeleteAdmissionPolicies(context.Background(), runsNamespace); err != nil {
			t.Error(err)
		}
	})

	units := map[string]string{
		service:        strings.ReplaceAll(unit(t, "knotless-run.service"), docsRepo, w.Owner.DID.String()+"/hello"),
		refreshService: unit(t, refreshService),
		refreshTimer:   unit(t, refreshTimer),
		// The test's schedule: once, soon after the timer starts.
		refreshTimer + ".d/test.conf": "[Timer]\nOnActiveSec=2s\nRandomizedDelaySec=0\n",
	}
	a := boot(t, w, units, w.settings(map[string]any{
		"executor":   "kubernetes",
		"kubeconfig": "/var/lib/knotless/kubeconfig",
		"namespace":  runsNamespace,
		"image":      c.Image,
		"discover":   false,
	}), w.Password)
	// The operator's files the module's unit reads: the admin credential
	// of the cluster (k3s's path), the secrets and the environment file.
	a.writeFile("/etc/rancher/k3s/k3s.yaml", adminKubeconfig(t, c.Kubeconfig), 0o600)
	a.writeFile("/run/secrets/knotless-run/secrets.json", []byte(`{"DEPLOY_TOKEN": "`+secretValue+`"}`), 0o600)
	a.writeFile("/run/secrets/knotless-run/env", nil, 0o600)

	if out, err := a.systemctl("start", service); err != nil {
		t.Fatalf("systemctl start: %v\n%s", err, out)
	}
	if got := a.show(refreshService, "Result"); got != "success" {
		t.Fatalf("the kubeconfig oneshot: %s", got)
	}
	first := a.sh(`cat /var/lib/knotless/kubeconfig`)
	pid := a.show(service, "MainPID")

	t.Run("a run as a Job", func(t *testing.T) {
		commit := w.push(map[string]string{".knotless/workflows/build.yaml": `
on: [push]
secrets: [DEPLOY_TOKEN]
steps:
  - name: build
    secrets: [DEPLOY_TOKEN]
    run: |
      echo "token=$DEPLOY_TOKEN"
      test "$DEPLOY_TOKEN" = "` + secretValue + `"
`})
		got := w.waitCheck("build", commit, 3*time.Minute, final)
		if got.Status != "success" {
			t.Fatalf("check %s (%s)", got.Status, got.Error)
		}
		blob := w.blob(t, got)
		if strings.Contains(blob, secretValue) || !strings.Contains(blob, "token=***") {
			t.Errorf("the secret is not masked in the log blob:\n%s", blob)
		}
	})

	t.Run("refresh timer", func(t *testing.T) {
		before := a.show(refreshService, "InvocationID")
		if out, err := a.systemctl("start", refreshTimer); err != nil {
			t.Fatalf("start the timer: %v\n%s", err, out)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for a.show(refreshService, "InvocationID") == before || a.show(refreshService, "ActiveState") != "inactive" {
			if time.Now().After(deadline) {
				t.Fatalf("the timer did not run the oneshot again")
			}
			time.Sleep(200 * time.Millisecond)
		}
		if got := a.show(refreshService, "Result"); got != "success" {
			t.Fatalf("the refresh: %s", got)
		}
		second := a.sh(`cat /var/lib/knotless/kubeconfig`)
		if second == first {
			t.Fatal("the refresh did not replace the kubeconfig")
		}
		if got := strings.TrimSpace(a.sh(`stat -c '%a %U' /var/lib/knotless/kubeconfig`)); got != "600 knotless" {
			t.Errorf("kubeconfig mode and owner %q, want 600 knotless", got)
		}
		if a.sh(`ls /var/lib/knotless/ | grep -c kubeconfig.new || true`) != "0\n" {
			t.Errorf("the temporary kubeconfig is left behind")
		}

		commit := w.push(map[string]string{".knotless/workflows/after.yaml": "on: [push]\nsteps:\n  - {name: a, run: echo after the refresh}\n"})
		got := w.waitCheck("after", commit, 3*time.Minute, final)
		if got.Status != "success" {
			t.Fatalf("the run after the refresh: %s (%s)", got.Status, got.Error)
		}
		if now := a.show(service, "MainPID"); now != pid {
			t.Errorf("the daemon was restarted (PID %s, was %s)", now, pid)
		}
		if e := find(a.journal(service), "kubeconfig changed: using the new credentials"); len(e) == 0 {
			t.Errorf("the daemon did not take up the new kubeconfig")
		}
	})

	t.Run("restart mid-run adopts", func(t *testing.T) {
		commit := w.push(map[string]string{".knotless/workflows/long.yaml": `
on: [push]
steps:
  - name: long
    run: |
      echo before
      touch "$KNOTLESS_RUN_WORK/step-started"
      sleep 15
      echo after
`})
		w.waitCheck("long", commit, 3*time.Minute, running)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		selector := kubernetes.LabelRunner + "=" + kubernetes.RunnerLabel(w.Runner.DID.String())
		if err := c.WaitForCommand(ctx, runsNamespace, selector, "run", []string{"test", "-e", "/work/step-started"}); err != nil {
			t.Fatalf("the step did not start: %v", err)
		}
		oldPID := a.show(service, "MainPID")
		if out, err := a.systemctl("restart", service); err != nil {
			t.Fatalf("systemctl restart: %v\n%s", err, out)
		}
		got := w.waitCheck("long", commit, 3*time.Minute, final)
		if got.Status != "success" {
			t.Fatalf("the adopted run: %s (%s)", got.Status, got.Error)
		}
		journal := a.journal(service)
		if e := find(journal, "handed over 1 runs"); len(e) != 1 || e[0]["_PID"] != oldPID || e[0]["GOING_ON"] != "1" {
			t.Errorf("want the old process (%s) to hand its going run over once; got %v", oldPID, e)
		}
		if e := find(journal, "adopted 1 runs"); len(e) != 1 || e[0]["_PID"] == oldPID {
			t.Errorf("want the new process to adopt the run once; got %v", e)
		}
		blob := w.blob(t, got)
		for _, line := range []string{"before", "after"} {
			if n := strings.Count("\n"+blob, "\n"+line+"\n"); n != 1 {
				t.Errorf("line %q %d times in the log blob, want once:\n%s", line, n, blob)
			}
		}
		// Runs, a refresh and a handover, all clean: the journal has no
		// error line. (client-go logged the handover's closed exec
		// streams as "Unhandled Error" at level error, issue 35.)
		for _, e := range journal {
			if p := e["PRIORITY"]; p == "0" || p == "1" || p == "2" || p == "3" || strings.Contains(e["MESSAGE"], "level=error") {
				t.Errorf("an error line in a clean runner's journal (PID %s, PRIORITY %s): %s", e["_PID"], p, e["MESSAGE"])
			}
		}
	})

	t.Run("hardening", func(t *testing.T) {
		a.checkExposure(t, service)
		a.checkExposure(t, refreshService)
	})

	t.Run("no secret in the journal", func(t *testing.T) {
		for _, e := range a.journal("") {
			for k, v := range e {
				if strings.Contains(v, secretValue) || strings.Contains(v, w.Password) {
					t.Errorf("a secret is in the journal, field %s of %q", k, e["MESSAGE"])
				}
			}
		}
	})
}

// adminKubeconfig is the cluster's admin kubeconfig with its files
// embedded, as a credential file for the machine.
func adminKubeconfig(t *testing.T, path string) []byte {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := clientcmdapi.FlattenConfig(cfg); err != nil {
		t.Fatal(err)
	}
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFile writes a file in the machine as root.
func (a *appliance) writeFile(name string, data []byte, mode uint32) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd, err := a.Command(ctx, "sh", "-c", `mkdir -p "$(dirname "$1")" && umask 077 && cat > "$1" && chmod "$2" "$1"`, "sh", name, strconvOctal(mode))
	if err != nil {
		a.t.Fatal(err)
	}
	cmd.Stdin = bytes.NewReader(data)
	if out, err := cmd.CombinedOutput(); err != nil {
		a.t.Fatalf("write %s in the machine: %v\n%s", name, err, out)
	}
}
