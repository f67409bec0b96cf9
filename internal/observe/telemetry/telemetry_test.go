package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/observe/metrics"
	"knotless.dev/run/internal/observe/status"
	"knotless.dev/run/internal/observe/telemetry"
	"knotless.dev/run/internal/parts/rig"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/work"
	"knotless.dev/run/internal/rules/workflow"
)

func newMetrics(t *testing.T) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// scrape lists the series of names, one a line: name[labels] value (a
// histogram's value is count=N).
func scrape(t *testing.T, reg *prometheus.Registry, names ...string) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range fams {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.Metric {
			var ls []string
			for _, l := range m.Label {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			fmt.Fprintf(&b, "%s[%s] ", f.GetName(), strings.Join(ls, " "))
			switch {
			case m.Histogram != nil:
				fmt.Fprintf(&b, "count=%d\n", m.Histogram.GetSampleCount())
			case m.Counter != nil:
				fmt.Fprintf(&b, "%g\n", m.Counter.GetValue())
			default:
				fmt.Fprintf(&b, "%g\n", m.Gauge.GetValue())
			}
		}
	}
	return b.String()
}

// num is the value of the one series of name.
func num(t *testing.T, reg *prometheus.Registry, name string) string {
	t.Helper()
	line := scrape(t, reg, name)
	_, v, _ := strings.Cut(strings.TrimSpace(line), "] ")
	return v
}

// TestParts: what the scheduler and the lander observe, in the metrics:
// a push's pickup (a pull has none), the wait of a run that started (an
// adopted one waited elsewhere), the runs that ended final by status,
// kind and the executor's name (one released before its session started
// has not ended), the merge queue's ejections and landings.
func TestParts(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	p := telemetry.Parts{M: m, Executor: "kubernetes"}
	push := &job.Job{Event: rig.Push("3k1", "c1"), Workflow: &workflow.Workflow{Name: "ci"}}
	push.Event.Push = &forge.RefUpdate{CreatedAt: time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)}
	pull := &job.Job{Event: rig.Pull("did:plc:a", "3k2", "c2"), Workflow: &workflow.Workflow{Name: "ci"}}
	p.Queued(push)
	p.Queued(pull)
	p.Started(push, "r1", time.Now().Add(-2*time.Minute))
	p.Started(pull, "r2", time.Time{})
	start := time.Now()
	p.Ended(push, &run.Result{Status: run.Success, StartedAt: start, FinishedAt: start.Add(3 * time.Second)})
	p.Ended(pull, &run.Result{Status: run.Detached, StartedAt: start, FinishedAt: start})
	p.Ended(pull, &run.Result{Status: run.Failure, StartedAt: start, FinishedAt: start.Add(time.Second)})
	p.Ejected("at://repo", forge.EjectConflictBase)
	p.Landed("at://repo", 2)

	got := scrape(t, reg, "knotless_run_pickup_seconds", "knotless_run_queue_wait_seconds", "knotless_run_runs_total",
		"knotless_run_mergequeue_ejections_total", "knotless_run_mergequeue_landings_total")
	for _, want := range []string{
		"knotless_run_pickup_seconds[] count=1",
		"knotless_run_queue_wait_seconds[] count=1",
		"knotless_run_runs_total[executor=kubernetes kind=push status=success] 1",
		"knotless_run_runs_total[executor=kubernetes kind=pull status=failure] 1",
		"knotless_run_mergequeue_ejections_total[reason=conflictBase] 1",
		"knotless_run_mergequeue_landings_total[] 1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "detached") || strings.Count(got, "knotless_run_runs_total") != 2 {
		t.Errorf("runs counted:\n%s", got)
	}
	for _, ev := range []work.Event{pull.Event, {Push: &forge.RefUpdate{CreatedAt: "yesterday"}}} {
		if at, ok := telemetry.EventTime(ev); ok {
			t.Errorf("EventTime(%+v) = %s, want none", ev, at)
		}
	}
}

// TestExecutor: the executor's observations reach the metrics, and its
// credentials' expiry is kept for the status (a zero time forgets it).
func TestExecutor(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	e := &telemetry.Executor{M: m}
	at := time.Now().Add(time.Hour)
	e.SessionReady(time.Second)
	e.Transferred("in", 10, time.Second)
	e.Swept(2, nil)
	e.CleanupFailed()
	e.CredentialExpiry("kubernetes", at)
	if diff := cmp.Diff([]status.Credential{{Name: "kubernetes", Expires: at.UTC()}}, e.Credentials()); diff != "" {
		t.Errorf("credentials (-want +got):\n%s", diff)
	}
	got := scrape(t, reg, "knotless_run_session_ready_seconds", "knotless_run_swept_objects_total", "knotless_run_cleanup_failures_total",
		"knotless_run_credential_expiry_seconds", "knotless_run_transfer_bytes")
	for _, want := range []string{"session_ready_seconds[] count=1", "swept_objects_total[] 2", "cleanup_failures_total[] 1",
		"credential_expiry_seconds[credential=kubernetes]", "transfer_bytes[direction=in] count=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	e.CredentialExpiry("kubernetes", time.Time{})
	if c := e.Credentials(); len(c) != 0 {
		t.Errorf("credentials after a zero expiry: %+v", c)
	}
	// Without metrics, the status still learns the expiry.
	bare := &telemetry.Executor{}
	bare.CredentialExpiry("kubernetes", at)
	bare.Swept(1, nil)
	if len(bare.Credentials()) != 1 {
		t.Error("no credential kept without metrics")
	}
}

// TestOutboxAndWriter: the owed checks are counted at every change; a
// record the PDS or the lexicon refuses is counted, another failure is
// not.
func TestOutboxAndWriter(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	st, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	o := telemetry.Outbox{Outbox: st, M: m}
	owed := func() string { return num(t, reg, "knotless_run_owed_checks") }
	for _, k := range []string{"a", "b"} {
		if err := o.Owe(k, state.Owed{Event: "e"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := owed(); got != "2" {
		t.Errorf("owed %s after two, want 2", got)
	}
	_ = o.Paid("a")
	_ = o.Forgive("b")
	if got := owed(); got != "0" {
		t.Errorf("owed %s after paying and forgiving, want 0", got)
	}

	pds := &rig.PDS{}
	pds.FailNext(fmt.Errorf("put: %w", pdsclient.ErrInvalid), &atclient.APIError{StatusCode: http.StatusBadRequest, Name: "InvalidRecord"},
		&atclient.APIError{StatusCode: http.StatusBadRequest, Name: "ExpiredToken"}, rig.ErrDown, nil)
	w := telemetry.Writer{Writer: pds, M: m}
	for range 5 {
		_, _ = w.Put(context.Background(), forge.CollectionCheck, "k", forge.Check{Status: "success"})
	}
	if got := num(t, reg, "knotless_run_check_refusals_total"); got != "2" {
		t.Errorf("refusals %s, want 2", got)
	}
}

// TestListen: the status socket answers the provider's document, the
// metrics listener serves the metrics and the document, Close stops both
// and removes the socket; an address that cannot be listened on is an
// error naming --metrics-listen, and leaves no socket. As the operating
// guide says, /metrics there names no repository and /status does: the
// address is for the Prometheus host, not the public.
func TestListen(t *testing.T) {
	t.Parallel()
	m, _ := newMetrics(t)
	m.SetQueueDepth(3)
	// A run of the rig's repository, observed to its end.
	push := &job.Job{Event: rig.Push("3k1", "c1"), Workflow: &workflow.Workflow{Name: "ci"}}
	parts := telemetry.Parts{M: m, Executor: "kubernetes"}
	parts.Started(push, "r1", time.Now().Add(-time.Minute))
	parts.Ended(push, &run.Result{Status: run.Success, StartedAt: time.Now().Add(-time.Second), FinishedAt: time.Now()})
	event := push.Event.URI.String()
	dir := t.TempDir()
	p := provider{status.Doc{Runs: []status.Run{{Check: "k1", Workflow: "ci", Event: event}}}}
	srv, err := telemetry.Listen(dir, "127.0.0.1:0", m, p, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := status.Fetch(t.Context(), status.SocketPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if doc.Source != status.FromDaemon || len(doc.Runs) != 1 || doc.Runs[0].Check != "k1" {
		t.Errorf("document over the socket: %+v", doc)
	}
	srv.Close()
	if _, err := os.Stat(status.SocketPath(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket after Close: %v", err)
	}
	if _, err := status.Fetch(t.Context(), status.SocketPath(dir)); !errors.Is(err, status.ErrNotRunning) {
		t.Errorf("after Close: %v, want ErrNotRunning", err)
	}

	// The metrics listener, on a port of its own.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv, err = telemetry.Listen(dir, addr, m, p, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "knotless_run_queue_depth 3") || !strings.Contains(string(body), "go_goroutines") {
		t.Errorf("/metrics:\n%.2000s", body)
	}
	if !strings.Contains(string(body), "knotless_run_runs_total") || strings.Contains(string(body), rig.Owner) || strings.Contains(string(body), "3k1") {
		t.Errorf("/metrics names the run's repository, or not the run:\n%.2000s", body)
	}
	if doc, err := status.FetchURL(t.Context(), http.DefaultClient, "http://"+addr+status.Path); err != nil || len(doc.Runs) != 1 || doc.Runs[0].Event != event {
		t.Errorf("/status: %+v %v; want the whole document, the run's event too", doc, err)
	}
	// A second daemon on the same address (and state directory).
	other := t.TempDir()
	if _, err := telemetry.Listen(other, addr, m, p, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--metrics-listen "+addr) {
		t.Errorf("listen on a taken address: %v, want an error naming --metrics-listen", err)
	}
	if _, err := os.Stat(filepath.Join(other, status.SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket of a failed Listen: %v", err)
	}
}

type provider struct{ doc status.Doc }

func (p provider) Status(context.Context) status.Doc { return p.doc }
