package prometheus_test

import (
	"context"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"

	"knotless.dev/run/internal/observe/metrics"
	"knotless.dev/run/tests/prometheus"
)

// TestRules checks the alert rules and runs their unit tests with
// Debian's promtool (monitoring/knotless-run.rules.test.yml).
func TestRules(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: the alert rules' tests need promtool (Debian's prometheus, tests/prometheus/install)")
	}
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Fatal("promtool not found: install Debian's prometheus (tests/prometheus/install)")
	}
	rules := prometheus.RulesFile()
	for _, args := range [][]string{
		{"check", "rules", rules},
		{"test", "rules", strings.TrimSuffix(rules, ".yml") + ".test.yml"},
	} {
		out, err := exec.Command("promtool", args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestScrapesTheRunnersMetrics: a real Prometheus scrapes a loopback
// target serving the runner's metrics, its API answers with their
// values, the alert rules load and evaluate, and an alert fires when
// its condition holds (and another does not, when its does not).
func TestScrapesTheRunnersMetrics(t *testing.T) {
	t.Parallel()
	reg := promclient.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	target := httptest.NewServer(m.Handler())
	defer target.Close()
	m.RunFinished("success", "push", "kubernetes", 3*time.Second)
	m.RunFinished("success", "push", "kubernetes", 5*time.Second)
	m.RunFinished("failure", "pull", "kubernetes", time.Second)
	m.SetQueueDepth(4)
	m.CredentialExpiry("kubernetes", time.Now().Add(30*time.Minute))

	p := prometheus.Start(t, prometheus.Options{Targets: []string{strings.TrimPrefix(target.URL, "http://")}})
	const wait = time.Minute
	p.WaitValue(t, `up{job="knotless-run"}`, 1, wait)
	p.WaitValue(t, `knotless_run_runs_total{status="success",kind="push",executor="kubernetes"}`, 2, wait)
	p.WaitValue(t, `knotless_run_runs_total{status="failure",kind="pull"}`, 1, wait)
	p.WaitValue(t, `knotless_run_duration_seconds_sum{status="success",kind="push"}`, 8, wait)
	p.WaitValue(t, `knotless_run_queue_depth`, 4, wait)
	// A value that changes is seen changing.
	m.SetQueueDepth(1)
	p.WaitValue(t, `knotless_run_queue_depth`, 1, wait)
	left := p.WaitFor(t, `knotless_run_credential_expiry_seconds{credential="kubernetes"}`, wait, func(v model.Vector) bool { return len(v) == 1 })
	if s := float64(left[0].Value); s <= 0 || s > 1800 {
		t.Errorf("credential expiry %g s, want under 30 minutes", s)
	}
	// The Go runtime's and the process's metrics come with them.
	p.WaitFor(t, `process_resident_memory_bytes{job="knotless-run"}`, wait, func(v model.Vector) bool { return len(v) == 1 && v[0].Value > 0 })
	p.WaitFor(t, `go_goroutines{job="knotless-run"}`, wait, func(v model.Vector) bool { return len(v) == 1 && v[0].Value > 0 })

	// The rules load, and each has been evaluated without an error.
	ctx := context.Background()
	deadline := time.Now().Add(wait)
	for {
		res, err := p.API.Rules(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		healthy := true
		for _, g := range res.Groups {
			for _, r := range g.Rules {
				a, ok := r.(v1.AlertingRule)
				if !ok {
					t.Errorf("rule %v of group %s is not an alerting rule", r, g.Name)
					continue
				}
				names = append(names, a.Name)
				healthy = healthy && a.Health == v1.RuleHealthGood
				if a.Health == v1.RuleHealthBad {
					t.Errorf("rule %s: %s", a.Name, a.LastError)
				}
			}
		}
		if len(names) == 6 && healthy {
			t.Logf("rules loaded and evaluated: %v", names)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rules after %s: %v (healthy %v), want the 6 of %s", wait, names, healthy, prometheus.RulesFile())
		}
		time.Sleep(250 * time.Millisecond)
	}

	// 30 minutes left: the expiring alert fires (it has no `for`)...
	p.WaitValue(t, `ALERTS{alertname="KnotlessRunCredentialExpiring",alertstate="firing",credential="kubernetes"}`, 1, wait)
	// ... and the degraded one does not: the runner is not.
	if v, err := p.Query(ctx, `ALERTS{alertname="KnotlessRunDegraded"}`); err != nil || len(v) != 0 {
		t.Errorf("KnotlessRunDegraded: %v %v, want no alert", v, err)
	}
}
