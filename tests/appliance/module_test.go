package appliance_test

import (
	"strings"
	"testing"

	"knotless.dev/run/tests/clustertest"
)

// TestEgressAllowDNS: the module's Kubernetes runner with --egress
// allow-dns lists the host's addresses at start (a netlink request); the
// unit's RestrictAddressFamilies= lets it, so the daemon becomes ready
// instead of exiting and restarting forever.
func TestEgressAllowDNS(t *testing.T) {
	t.Parallel()
	c := clustertest.Start(t)
	w := newWorld(t)
	units := map[string]string{
		service: strings.ReplaceAll(unit(t, "knotless-run.service"), docsRepo, w.Owner.DID.String()+"/hello"),
	}
	a := boot(t, w, units, w.settings(map[string]any{
		"executor":   "kubernetes",
		"kubeconfig": "/etc/knotless/kubeconfig",
		"namespace":  c.Namespace,
		"image":      c.Image,
		"egress":     "allow-dns",
		"discover":   false,
	}), w.Password)
	a.writeFile("/etc/knotless/kubeconfig", adminKubeconfig(t, c.Kubeconfig), 0o600)
	a.sh(`chown -R knotless /etc/knotless`)
	a.writeFile("/run/secrets/knotless-run/secrets.json", []byte(`{}`), 0o600)
	a.writeFile("/run/secrets/knotless-run/env", nil, 0o600)

	if out, err := a.systemctl("start", service); err != nil {
		t.Fatalf("systemctl start with --egress allow-dns: %v\n%s", err, out)
	}
	if got := a.show(service, "NRestarts"); got != "0" {
		t.Errorf("NRestarts=%s, want 0", got)
	}
	for _, e := range a.journal(service) {
		if strings.Contains(e["MESSAGE"], "netlink") {
			t.Errorf("the daemon could not list the host's addresses: %s", e["MESSAGE"])
		}
	}
}

// TestConfigErrorStopsRestarts: a settings file the daemon refuses exits
// 78, and systemd (RestartPreventExitStatus=) leaves the unit failed
// instead of starting it again every few seconds, whether kong refuses
// it (a key that is no flag) or serve does (a rule between flags, found
// while its stderr is the journal); the refresh oneshot has a start
// timeout (a oneshot's default is none).
func TestConfigErrorStopsRestarts(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		extra map[string]any
	}{
		{"a key that is no flag", map[string]any{"concurency": 2}},                // a typo: no flag of serve
		{"a rule between flags", map[string]any{"unsafe-shell-untrusted": false}}, // the shell executor with discover
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			a := boot(t, w, map[string]string{
				service:        unit(t, "knotless-run.shell.service"),
				refreshService: unit(t, refreshService),
			}, w.settings(tt.extra), w.Password)

			if out, err := a.systemctl("start", service); err == nil {
				t.Fatalf("systemctl start with settings it refuses succeeded:\n%s", out)
			}
			// systemd decides on the exit at once: failed, or a restart
			// queued (ActiveState activating, SubState auto-restart).
			state := a.show(service, "ActiveState") + "/" + a.show(service, "SubState")
			if state != "failed/failed" || a.show(service, "ExecMainStatus") != "78" || a.show(service, "NRestarts") != "0" {
				t.Errorf("after exit %s the unit is %s with %s restarts; want failed/failed, no restart",
					a.show(service, "ExecMainStatus"), state, a.show(service, "NRestarts"))
			}
			if got := a.show(refreshService, "TimeoutStartUSec"); got != "2min" {
				t.Errorf("the refresh oneshot's start timeout is %s, want 2min", got)
			}
		})
	}
}
