package appliance_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/tests/clustertest"
	systemdtest "knotless.dev/run/tests/systemd"
)

// TestDeploy: deploy/ on a host without NixOS, under a real systemd: the
// operator runs deploy/install, fills in the files it names (and moves
// the runs to another namespace with a drop-in, as systemctl edit does),
// enables the units; a push runs as a Job; after a restart another push
// runs; deploy/uninstall leaves nothing on the host but the state
// directory it names.
func TestDeploy(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
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
	m := systemdtest.Boot(t, systemdtest.Options{Files: files, Binds: []string{w.Src.Dir + ":" + srcMount}})
	a := &appliance{Machine: m, t: t}
	// The host as it was before: names resolve, root's git trusts the
	// test's repository (owned by root), /usr/local is writable (the
	// machine's /usr is the test host's, read-only: a tmpfs with the
	// directories a distribution ships there).
	a.sh(`printf '127.0.0.1 localhost\n::1 localhost\n' > /etc/hosts && git config --system --add safe.directory '*' &&
		mount -t tmpfs -o mode=0755 knotless-usr-local /usr/local && mkdir -p /usr/local/bin /usr/local/sbin /usr/local/lib`)
	before := a.snapshot()

	out := a.sh(`sh ` + optPath + `/deploy/install ` + optPath + `/bin/knotless-run 2>&1`)
	if !strings.Contains(out, "systemctl enable --now knotless-run-kubeconfig.timer knotless-run.service") {
		t.Errorf("install did not say how to start:\n%s", out)
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
	// What the operator fills in.
	a.writeFile("/etc/knotless-run/config.json", w.settings(map[string]any{
		"executor":   "kubernetes",
		"kubeconfig": "/var/lib/knotless/kubeconfig",
		"namespace":  c.Namespace,
		"image":      c.Image,
		"discover":   false,
	}), 0o644)
	a.writeFile("/etc/knotless-run/env", []byte("KNOTLESS_DID="+w.Runner.DID.String()+"\nKNOTLESS_REPOS="+w.Owner.DID.String()+"/hello\n"), 0o600)
	a.writeFile("/etc/knotless-run/app-password", []byte(w.Password), 0o600)
	a.writeFile("/etc/knotless-run/admin-kubeconfig", adminKubeconfig(t, c.Kubeconfig), 0o600)
	refresh := a.sh(`sed -n 's/^ExecStart=//p' /etc/systemd/system/` + refreshService)
	a.writeFile("/etc/systemd/system/"+refreshService+".d/namespace.conf",
		[]byte("[Service]\nExecStart=\nExecStart="+strings.Replace(strings.TrimSpace(refresh), "--namespace knotless-runs", "--namespace "+c.Namespace, 1)+"\n"), 0o644)
	if out, err := a.systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
	if out, err := a.systemctl("enable", "--now", refreshTimer, service); err != nil {
		t.Fatalf("systemctl enable --now: %v\n%s", err, out)
	}

	push := func(name string) {
		t.Helper()
		commit := w.push(map[string]string{".knotless/workflows/" + name + ".yaml": "on: [push]\nsteps:\n  - {name: a, run: echo " + name + "}\n"})
		if got := w.waitCheck(name, commit, 3*time.Minute, final); got.Status != "success" {
			t.Fatalf("check of %s: %s (%s)", name, got.Status, got.Error)
		}
	}
	push("first")
	if out, err := a.systemctl("restart", service); err != nil {
		t.Fatalf("systemctl restart: %v\n%s", err, out)
	}
	push("after-restart")

	out = a.sh(`sh ` + optPath + `/deploy/uninstall`)
	if !strings.Contains(out, "kept /var/lib/knotless") {
		t.Errorf("uninstall did not name the state directory it keeps:\n%s", out)
	}
	after := a.snapshot()
	var added, removed []string
	for p := range after {
		if _, ok := before[p]; !ok && p != "/var/lib/knotless" && !strings.HasPrefix(p, "/var/lib/knotless/") {
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
	if _, ok := after["/var/lib/knotless/kubeconfig"]; !ok {
		t.Errorf("the state directory is gone")
	}
	if out, _ := a.systemctl("list-unit-files", "--no-legend", "knotless*"); strings.TrimSpace(out) != "" {
		t.Errorf("units still known to systemd:\n%s", out)
	}
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
