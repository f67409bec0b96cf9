package appliance_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/dockerd"
	systemdtest "knotless.dev/run/tests/systemd"
)

// TestDeploy: deploy/ on a host without NixOS, under a real systemd: the
// operator runs deploy/install (with the output service), fills in the
// files it names (and moves the runs to another namespace with a drop-in,
// as systemctl edit does), enables the units; a push runs as a Job; after
// a restart another push runs; the output service answers; deploy/uninstall
// leaves nothing on the host but the state directories it names.
func TestDeploy(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	a := bootDeploy(t, w, nil)
	before := a.snapshot()

	out := a.sh(`sh ` + optPath + `/deploy/install --output-service ` + optPath + `/bin/knotless-run 2>&1`)
	if !strings.Contains(out, "systemctl enable --now knotless-run-kubeconfig.timer knotless-run.service") ||
		!strings.Contains(out, "systemctl enable --now knotless-output.service") {
		t.Errorf("install did not say how to start the runner and the output service:\n%s", out)
	}
	// Debian 12's systemd (252) has no restart backoff: the drop-in with
	// it stays out, and install says what the runner does instead.
	v, err := strconv.Atoi(strings.TrimSpace(a.sh(`systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p'`)))
	if err != nil {
		t.Fatalf("systemd's version: %v", err)
	}
	if v < 254 {
		if !strings.Contains(out, "older than 254: knotless-run restarts every 5 s") {
			t.Errorf("install on systemd %d did not say the restart backoff is absent:\n%s", v, out)
		}
		if got := a.sh(`[ -e /etc/systemd/system/knotless-run.service.d/restart-backoff.conf ] && echo present || echo absent`); got != "absent\n" {
			t.Errorf("restart-backoff.conf on systemd %d: %s", v, got)
		}
	}
	a.startOnKubernetes(c, w)
	w.pushRuns("first", "echo first")
	if out, err := a.systemctl("restart", service); err != nil {
		t.Fatalf("systemctl restart: %v\n%s", err, out)
	}
	w.pushRuns("after-restart", "echo after-restart")

	// The output service, with its DID and runners from output.env, on
	// a port of the test's (a drop-in, as systemctl edit makes). It
	// exits at once, refusing its flags, when they do not arrive.
	a.writeFile("/etc/knotless-run/output.env", []byte("KNOTLESS_OUTPUT_DID="+goldenServiceDID+"\nKNOTLESS_OUTPUT_RUNNERS="+w.Runner.DID.String()+"\n"), 0o644)
	svcListen := "127.0.0.1:" + freePort(t)
	outputStart := a.sh(`sed -n 's/^ExecStart=//p' /etc/systemd/system/knotless-output.service`)
	a.writeFile("/etc/systemd/system/knotless-output.service.d/listen.conf",
		[]byte("[Service]\nExecStart=\nExecStart="+strings.Replace(strings.TrimSpace(outputStart), "--listen 127.0.0.1:8789", "--listen "+svcListen, 1)+"\n"), 0o644)
	if out, err := a.systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
	if out, err := a.systemctl("enable", "--now", "knotless-output.service"); err != nil {
		t.Fatalf("systemctl enable --now knotless-output.service: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get("http://" + svcListen + "/xrpc/_health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the output service does not answer at %s a minute after its start (%v); ExecMainStatus=%s", svcListen, err, a.show("knotless-output.service", "ExecMainStatus"))
		}
	}

	out = a.sh(`sh ` + optPath + `/deploy/uninstall`)
	if !strings.Contains(out, "kept /var/lib/knotless,") || !strings.Contains(out, "kept /var/lib/knotless-output,") {
		t.Errorf("uninstall did not name the state directories it keeps:\n%s", out)
	}
	after := a.snapshot()
	checkUninstalled(t, before, after, "/var/lib/knotless", "/var/lib/knotless-output")
	if _, ok := after["/var/lib/knotless/kubeconfig"]; !ok {
		t.Errorf("the state directory is gone")
	}
	if out, _ := a.systemctl("list-unit-files", "--no-legend", "knotless*"); strings.TrimSpace(out) != "" {
		t.Errorf("units still known to systemd:\n%s", out)
	}
}

// TestDeployRollback: rollback from Kubernetes to Docker, then to the
// shell executor, through deploy/ alone, as an operator does it: each
// switch is deploy/install --executor, the executor setting and a
// restart. A push runs as a Job, the next one in a container of the
// host's Docker daemon, the last one as a process of the runner's unit.
// Before deploy/ had a docker unit, the runner's unit kept
// PrivateUsers=true and had no docker group: the daemon could not reach
// Docker's socket and the docker run failed.
func TestDeployRollback(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	d := dockerd.Start(t)
	w := newWorld(t)
	a := bootDeploy(t, w, []string{strings.TrimPrefix(d.Host(), "unix://") + ":" + dockerSocket})
	// The host's Docker is the test's private dockerd (its socket bound
	// in); the machine's own, from the test host's /usr, stays off.
	a.sh(`systemctl mask docker.service docker.socket containerd.service`)
	if out := a.sh(`sh ` + optPath + `/deploy/install ` + optPath + `/bin/knotless-run 2>&1`); !strings.Contains(out, "for the kubernetes executor") {
		t.Errorf("install without --executor on a new host did not install the kubernetes unit:\n%s", out)
	}
	a.startOnKubernetes(c, w)
	w.pushRuns("on-kubernetes", "echo on-kubernetes")

	// The step says where it runs: Docker's containers have /.dockerenv.
	const where = `echo "as $(id -un) in $(if [ -e /.dockerenv ]; then echo docker; else echo the unit; fi)"`
	switchTo := func(executor string, extra map[string]any) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := a.Exec(ctx, "sh", "-c", `sh `+optPath+`/deploy/install --executor `+executor+` `+optPath+`/bin/knotless-run 2>&1`)
		if err != nil {
			t.Fatalf("deploy/install --executor %s: %v", executor, err)
		}
		if !strings.Contains(string(out), "for the "+executor+" executor") || !strings.Contains(string(out), `set "executor": "`+executor+`"`) {
			t.Errorf("install --executor %s did not say which unit it installed and that config.json names another executor:\n%s", executor, out)
		}
		settings := map[string]any{
			"executor":   executor,
			"kubeconfig": "/var/lib/knotless/kubeconfig",
			"namespace":  c.Namespace,
			"discover":   false,
		}
		for k, v := range extra {
			settings[k] = v
		}
		a.writeFile("/etc/knotless-run/config.json", w.settings(settings), 0o644)
		if out, err := a.systemctl("disable", "--now", refreshTimer); err != nil {
			t.Fatalf("systemctl disable --now %s: %v\n%s", refreshTimer, err, out)
		}
		if out, err := a.systemctl("restart", service); err != nil {
			t.Fatalf("systemctl restart on %s: %v\n%s", executor, err, out)
		}
	}

	// Docker's package makes the group docker; without it install
	// refuses the docker unit, which would not start.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	out, err := a.Exec(ctx, "sh", optPath+"/deploy/install", "--executor", "docker", optPath+"/bin/knotless-run")
	cancel()
	if err == nil || !strings.Contains(string(out), "no group docker") {
		t.Errorf("install --executor docker on a host without group docker: %v, want a refusal naming the group:\n%s", err, out)
	}
	a.sh(`echo "g docker -" > /etc/sysusers.d/docker.conf && systemd-sysusers && chgrp docker "$1" && chmod 0660 "$1"`, dockerSocket)
	switchTo("docker", map[string]any{"docker-host": "unix://" + dockerSocket, "image": d.Image()})
	if got := w.blob(t, w.pushRuns("on-docker", where)); !strings.Contains(got, "as root in docker\n") {
		t.Errorf("the docker run's log:\n%s", got)
	}

	switchTo("shell", nil)
	if got := w.blob(t, w.pushRuns("on-shell", where)); !strings.Contains(got, "as knotless in the unit\n") {
		t.Errorf("the shell run's log:\n%s", got)
	}
	for _, e := range a.journal(service) {
		if p := e["PRIORITY"]; p == "0" || p == "1" || p == "2" || p == "3" {
			t.Errorf("an error line in the journal (PID %s, PRIORITY %s): %s", e["_PID"], p, e["MESSAGE"])
		}
	}
}

// TestDeployInstance: an instance beside the default runner through
// deploy/ alone, as the module's services.knotless-run.instances: deploy/install
// --instance beta makes its units, user, directories and settings
// (/etc/knotless-run/beta); both runners, on the shell executor, run a
// push of their own repositories, each as its own user; deploy/uninstall
// removes both and keeps both state directories, saying so.
func TestDeployInstance(t *testing.T) {
	t.Parallel()
	const betaMount = "/srv/knotless-test-src-beta"
	w, beta := newWorld(t), newWorldAt(t, betaMount)
	a := bootDeploy(t, w, []string{beta.Src.Dir + ":" + betaMount})
	before := a.snapshot()
	a.sh(`sh ` + optPath + `/deploy/install --executor shell ` + optPath + `/bin/knotless-run 2>&1`)
	out := a.sh(`sh ` + optPath + `/deploy/install --instance beta --executor shell ` + optPath + `/bin/knotless-run 2>&1`)
	if !strings.Contains(out, "/etc/knotless-run/beta/config.json") || !strings.Contains(out, "systemctl enable --now knotless-run-beta.service") {
		t.Errorf("install --instance beta did not name its files and unit:\n%s", out)
	}
	var settings map[string]any
	if err := json.Unmarshal([]byte(a.sh(`cat /etc/knotless-run/beta/config.json`)), &settings); err != nil {
		t.Fatalf("the instance's config.json: %v", err)
	}
	want := map[string]any{"state-dir": "/var/lib/knotless-beta", "cache-dir": "/var/cache/knotless-beta", "kubeconfig": "/var/lib/knotless-beta/kubeconfig"}
	for k, v := range want {
		if settings[k] != v {
			t.Errorf("the instance's config.json has %s %v, want %v", k, settings[k], v)
		}
	}

	for _, r := range []struct {
		dir  string
		w    *world
		dirs map[string]any
	}{
		{"/etc/knotless-run", w, nil},
		{"/etc/knotless-run/beta", beta, map[string]any{"state-dir": "/var/lib/knotless-beta", "cache-dir": "/var/cache/knotless-beta"}},
	} {
		s := map[string]any{"executor": "shell", "discover": false}
		for k, v := range r.dirs {
			s[k] = v
		}
		a.writeFile(r.dir+"/config.json", r.w.settings(s), 0o644)
		a.writeFile(r.dir+"/env", []byte("KNOTLESS_DID="+r.w.Runner.DID.String()+"\nKNOTLESS_REPOS="+r.w.Owner.DID.String()+"/hello\n"), 0o600)
		a.writeFile(r.dir+"/app-password", []byte(r.w.Password), 0o600)
	}
	if out, err := a.systemctl("enable", "--now", service, "knotless-run-beta.service"); err != nil {
		t.Fatalf("systemctl enable --now: %v\n%s", err, out)
	}
	const whoami = `echo "as $(id -un)"`
	if got := w.blob(t, w.pushRuns("default", whoami)); !strings.Contains(got, "as knotless\n") {
		t.Errorf("the default runner's run:\n%s", got)
	}
	if got := beta.blob(t, beta.pushRuns("beta", whoami)); !strings.Contains(got, "as knotless-beta\n") {
		t.Errorf("the instance's run:\n%s", got)
	}
	const owners = "/var/lib/knotless knotless\n/var/cache/knotless knotless\n/var/lib/knotless-beta knotless-beta\n/var/cache/knotless-beta knotless-beta\n"
	if got := a.sh(`stat -c '%n %U' /var/lib/knotless /var/cache/knotless /var/lib/knotless-beta /var/cache/knotless-beta`); got != owners {
		t.Errorf("the runners' directories and owners:\n%s\nwant:\n%s", got, owners)
	}

	out = a.sh(`sh ` + optPath + `/deploy/uninstall`)
	if !strings.Contains(out, "kept /var/lib/knotless,") || !strings.Contains(out, "kept /var/lib/knotless-beta,") {
		t.Errorf("uninstall did not name the state directories it keeps:\n%s", out)
	}
	checkUninstalled(t, before, a.snapshot(), "/var/lib/knotless", "/var/lib/knotless-beta")
}

// checkUninstalled: what uninstall left is what was there before it
// was installed (before and after: snapshots), but for the state
// directories it keeps.
func checkUninstalled(t *testing.T, before, after map[string]string, keep ...string) {
	t.Helper()
	var added, removed []string
	for p := range after {
		kept := false
		for _, d := range keep {
			kept = kept || p == d || strings.HasPrefix(p, d+"/")
		}
		if _, ok := before[p]; !ok && !kept {
			added = append(added, p)
		}
	}
	for p, sum := range before {
		if got, ok := after[p]; !ok {
			removed = append(removed, p)
		} else if sum != "" && got != sum {
			added = append(added, p+" (changed)")
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	if len(added) > 0 || len(removed) > 0 {
		t.Errorf("uninstall left %v and removed %v", added, removed)
	}
}

// bootDeploy boots a machine with deploy/ and the binary under OptPath,
// as a host before deploy/install: names resolve, root's git trusts the
// test's repository (owned by root), /usr/local is writable (the
// machine's /usr is the test host's, read-only: a tmpfs with the
// directories a distribution ships there).
func bootDeploy(t *testing.T, w *world, binds []string) *appliance {
	t.Helper()
	files := map[string][]byte{"bin/knotless-run": binary}
	entries, err := os.ReadDir(filepath.Join(repoRoot(), "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files["deploy/"+e.Name()] = b
	}
	m := systemdtest.Boot(t, systemdtest.Options{Files: files, Binds: append([]string{w.Src.Dir + ":" + srcMount}, binds...)})
	a := &appliance{Machine: m, t: t}
	a.sh(`printf '127.0.0.1 localhost\n::1 localhost\n' > /etc/hosts && git config --system --add safe.directory '*' &&
		mount -t tmpfs -o mode=0755 knotless-usr-local /usr/local && mkdir -p /usr/local/bin /usr/local/sbin /usr/local/lib`)
	return a
}

// startOnKubernetes fills in what deploy/install named for the
// Kubernetes executor (and moves the runs to the test's namespace with a
// drop-in, as systemctl edit does) and enables the units.
func (a *appliance) startOnKubernetes(c *clustertest.Cluster, w *world) {
	a.t.Helper()
	a.writeFile("/etc/knotless-run/config.json", w.settings(map[string]any{
		"executor":   "kubernetes",
		"kubeconfig": "/var/lib/knotless/kubeconfig",
		"namespace":  c.Namespace,
		"image":      c.Image,
		"discover":   false,
	}), 0o644)
	a.writeFile("/etc/knotless-run/env", []byte("KNOTLESS_DID="+w.Runner.DID.String()+"\nKNOTLESS_REPOS="+w.Owner.DID.String()+"/hello\n"), 0o600)
	a.writeFile("/etc/knotless-run/app-password", []byte(w.Password), 0o600)
	a.writeFile("/etc/knotless-run/admin-kubeconfig", adminKubeconfig(a.t, c.Kubeconfig), 0o600)
	refresh := a.sh(`sed -n 's/^ExecStart=//p' /etc/systemd/system/` + refreshService)
	a.writeFile("/etc/systemd/system/"+refreshService+".d/namespace.conf",
		[]byte("[Service]\nExecStart=\nExecStart="+strings.Replace(strings.TrimSpace(refresh), "--namespace knotless-runs", "--namespace "+c.Namespace, 1)+"\n"), 0o644)
	if out, err := a.systemctl("daemon-reload"); err != nil {
		a.t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
	if out, err := a.systemctl("enable", "--now", refreshTimer, service); err != nil {
		a.t.Fatalf("systemctl enable --now: %v\n%s", err, out)
	}
}

// pushRuns pushes a workflow NAME of one step, script, and waits for its
// check to end success.
func (w *world) pushRuns(name, script string) forge.Check {
	w.t.Helper()
	commit := w.push(map[string]string{".knotless/workflows/" + name + ".yaml": "on: [push]\nsteps:\n  - name: a\n    run: " + strconv.Quote(script) + "\n"})
	got := w.waitCheck(name, commit, 3*time.Minute, final)
	if got.Status != "success" {
		w.t.Fatalf("check of %s: %s (%s)", name, got.Status, got.Error)
	}
	return got
}

// snapshot lists the machine's files where an installation goes (/etc,
// /usr/local, /var), with the checksum of the account databases, which
// must come back as they were. Left out: the journal, and the backups
// (/etc/passwd- …) and lock that the tools editing those databases keep.
func (a *appliance) snapshot() map[string]string {
	a.t.Helper()
	out := a.sh(`find /etc /usr/local /var -xdev \( -path /var/log/journal -o -path /etc/passwd- -o -path /etc/group- ` +
		`-o -path /etc/shadow- -o -path /etc/gshadow- -o -path /etc/.pwd.lock \) -prune -o -print`)
	files := map[string]string{}
	for _, p := range strings.Split(strings.TrimSpace(out), "\n") {
		files[p] = ""
	}
	for _, db := range []string{"/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow"} {
		if _, ok := files[db]; ok {
			files[db] = a.sh(`sha256sum ` + db)
		}
	}
	return files
}
