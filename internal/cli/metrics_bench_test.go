package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/forgeworld"
	"knotless.dev/run/tests/pds"
)

// BenchmarkServeMetricsCost measures what --metrics-listen costs a real
// daemon: two knotless-run daemons (the binary) serve a real PDS on the
// shell executor side by side, one without the flag and one with it
// (scraped every second, as Prometheus would), and run the same number
// of pushes each. It reports the mean run duration of each (the
// engine's, from its "run finished" journal line), their ratio, and each
// daemon's resident memory after the runs (VmRSS) and the CPU time it
// used (its own, not its steps'). The bounds:
// at most 2 % more run duration and 5 MB more memory. One run of the
// benchmark gives the ratio; nothing here asserts a time.
func BenchmarkServeMetricsCost(b *testing.B) {
	if testing.Short() {
		b.Skip(pds.ErrSkip)
	}
	if err := pds.Installed(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	srv, err := pds.Start(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	bin := filepath.Join(b.TempDir(), "knotless-run")
	if out, err := exec.Command("go", "build", "-o", bin, "knotless.dev/run/cmd/knotless-run").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	const runs = 100
	for i := range b.N {
		// Both worlds first, then both daemons at once: the machine's
		// load falls on the two alike.
		off := newBenchDaemon(b, srv, bin, fmt.Sprintf("bench-off-%d", i), runs, false)
		on := newBenchDaemon(b, srv, bin, fmt.Sprintf("bench-on-%d", i), runs, true)
		off.start()
		on.start()
		offRun, offRSS, offCPU := off.wait(ctx)
		onRun, onRSS, onCPU := on.wait(ctx)
		b.ReportMetric(float64(offRun.Microseconds())/1000, "run-ms-off")
		b.ReportMetric(float64(onRun.Microseconds())/1000, "run-ms-on")
		b.ReportMetric(float64(onRun)/float64(offRun), "run-ratio")
		b.ReportMetric(float64(offRSS)/1024, "rss-MB-off")
		b.ReportMetric(float64(onRSS)/1024, "rss-MB-on")
		b.ReportMetric(float64(onRSS-offRSS)/1024, "rss-delta-MB")
		b.ReportMetric(float64(offCPU.Microseconds())/1000/runs, "cpu-ms/run-off")
		b.ReportMetric(float64(onCPU.Microseconds())/1000/runs, "cpu-ms/run-on")
		b.ReportMetric(float64(onCPU)/float64(offCPU), "cpu-ratio")
	}
}

// benchDaemon is one daemon of BenchmarkServeMetricsCost and its world.
type benchDaemon struct {
	b     *testing.B
	w     *forgeworld.World
	cmd   *exec.Cmd
	logs  *syncbuf.Buffer
	runs  int
	addr  string // its metrics listener; "" without
	stop  chan struct{}
	scrap chan struct{}
}

// newBenchDaemon makes a world with runs pushes, each on a branch of
// its own (none supersedes another), and the serve command of it.
func newBenchDaemon(b *testing.B, srv *pds.Server, bin, app string, runs int, metrics bool) *benchDaemon {
	b.Helper()
	w := forgeworld.New(b, srv, forgeworld.Options{App: app})
	for i := range runs {
		branch := fmt.Sprintf("b%d", i)
		commit := w.Src.Commit(branch, map[string]string{".knotless/workflows/ci.yaml": "on: [push]\nsteps:\n  - name: hi\n    run: echo hi\n",
			"n.txt": strconv.Itoa(i)})
		w.Put(w.Owner, forge.CollectionRefUpdate, "", forge.RefUpdate{Type: forge.CollectionRefUpdate, Repo: w.RepoURI.String(),
			Ref: "refs/heads/" + branch, New: commit, CreatedAt: forge.Now()})
	}
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte(w.Password+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	args := []string{"--log-format", "json", "serve", "--did", w.Runner.DID.String(), "--pds", srv.URL, "--plc-url", srv.PLCURL,
		"--state-dir", filepath.Join(dir, "state"), "--cache-dir", filepath.Join(dir, "cache"), "--app-password-file", filepath.Join(dir, "pw"),
		"--executor", "shell", "--shell-root", b.TempDir(), "--allow-local-sources", "--poll", "1s",
		w.Owner.DID.String() + "/" + forgeworld.RepoName}
	d := &benchDaemon{b: b, w: w, logs: &syncbuf.Buffer{}, runs: runs, stop: make(chan struct{}), scrap: make(chan struct{})}
	if metrics {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		d.addr = l.Addr().String()
		l.Close()
		args = append(args, "--metrics-listen", d.addr)
	}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Env = append(os.Environ(), "CREDENTIALS_DIRECTORY=")
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	return d
}

// start starts the daemon, and a scrape of its metrics a second, as
// Prometheus would.
func (d *benchDaemon) start() {
	b := d.b
	if err := d.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		_ = d.cmd.Wait()
	})
	go func() {
		defer close(d.scrap)
		if d.addr == "" {
			return
		}
		for {
			select {
			case <-d.stop:
				return
			case <-time.After(time.Second):
			}
			if resp, err := http.Get("http://" + d.addr + "/metrics"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()
}

// wait waits for the daemon's runs and returns their mean duration,
// the slowest and fastest tenth left out (a run that met a burst of the
// machine's other work), the daemon's resident memory in kB, and the CPU
// time it used (its own, not its steps').
func (d *benchDaemon) wait(ctx context.Context) (time.Duration, int, time.Duration) {
	b := d.b
	defer func() { close(d.stop); <-d.scrap }()
	var durations []time.Duration
	for {
		durations = durations[:0]
		for line := range strings.Lines(d.logs.String()) {
			var e struct {
				Msg       string `json:"msg"`
				Component string `json:"component"`
				Status    string `json:"status"`
				Duration  int64  `json:"duration"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "run finished" && e.Component == "run" && e.Status == "success" {
				durations = append(durations, time.Duration(e.Duration))
			}
		}
		if len(durations) == d.runs {
			break
		}
		select {
		case <-ctx.Done():
			b.Fatalf("%d of %d runs done\n%s", len(durations), d.runs, d.logs.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	if d.addr != "" {
		resp, err := http.Get("http://" + d.addr + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf(`knotless_run_runs_total{executor="shell",kind="push",status="success"} %d`, d.runs); !strings.Contains(string(body), want) {
			b.Fatalf("the scrape has no %s:\n%s", want, body)
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	rss := 0
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rss, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	// utime and stime, the 14th and 15th fields of /proc/PID/stat (after
	// the command's name, which ends with ")"), in clock ticks of 1/100 s.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.Atoi(fields[11])
	stime, _ := strconv.Atoi(fields[12])
	cpu := time.Duration(utime+stime) * 10 * time.Millisecond
	slices.Sort(durations)
	cut := len(durations) / 10
	var sum time.Duration
	for _, d := range durations[cut : len(durations)-cut] {
		sum += d
	}
	return sum / time.Duration(len(durations)-2*cut), rss, cpu
}
