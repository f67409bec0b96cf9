package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"knotless.dev/run/internal/executor"
)

// observed records what the executor tells its observer.
type observed struct {
	mu        sync.Mutex
	ready     int
	in, out   []int64
	sweeps    []int
	sweepErrs int
	cleanups  int
	fenced    int
}

func (o *observed) SessionReady(time.Duration) { o.mu.Lock(); o.ready++; o.mu.Unlock() }
func (o *observed) FenceConflict()             { o.mu.Lock(); o.fenced++; o.mu.Unlock() }
func (o *observed) Transferred(dir string, n int64, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if dir == executor.DirectionIn {
		o.in = append(o.in, n)
	} else {
		o.out = append(o.out, n)
	}
}
func (o *observed) Swept(n int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sweeps = append(o.sweeps, n)
	if err != nil {
		o.sweepErrs++
	}
}
func (o *observed) CleanupFailed()                     { o.mu.Lock(); o.cleanups++; o.mu.Unlock() }
func (o *observed) CredentialExpiry(string, time.Time) {}
func (o *observed) WarmPods(int, int)                  {}
func (o *observed) WarmTaken()                         {}

func (o *observed) snapshot() observed {
	o.mu.Lock()
	defer o.mu.Unlock()
	return observed{ready: o.ready, in: append([]int64(nil), o.in...), out: append([]int64(nil), o.out...),
		sweeps: append([]int(nil), o.sweeps...), sweepErrs: o.sweepErrs, cleanups: o.cleanups}
}

// TestObserver: the docker executor tells its observer what the
// Kubernetes executor tells its own: a session ready, each transfer in
// and out with its bytes, each sweep with the runs it removed, and a run
// whose objects could not be removed, which its log line counts too.
func TestObserver(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	did := runner(t)
	ctx := context.Background()
	var logs bytes.Buffer
	var logMu sync.Mutex
	obs := &observed{}
	ex := newExecutor(t, d, did, Config{Observer: obs, Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))})

	s := startSession(t, ex, d.Image(), "seen", executor.Resources{})
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	if err := tw.WriteHeader(&tar.Header{Name: "a.txt", Mode: 0o644, Size: 5, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte("hello"))
	_ = tw.Close()
	size := int64(in.Len())
	if err := s.Put(ctx, "/work", &in); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := s.Get(ctx, "/work", &out); err != nil {
		t.Fatal(err)
	}
	got := obs.snapshot()
	if got.ready != 1 || len(got.in) != 1 || got.in[0] != size || len(got.out) != 1 || got.out[0] != int64(out.Len()) {
		t.Errorf("observed ready %d, in %v (want [%d]), out %v (want [%d])", got.ready, got.in, size, got.out, out.Len())
	}

	// A run whose volume another container holds cannot be removed.
	stuck := startSession(t, ex, d.Image(), "stuck", executor.Resources{})
	cli, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	holder, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: d.Image(), Entrypoint: []string{"true"}},
		HostConfig: &container.HostConfig{Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: stuck.names.volumes["work"], Target: "/held"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := stuck.Stop(ctx); err == nil {
		t.Error("a run whose volume is held stopped without an error")
	}
	if got := obs.snapshot().cleanups; got != 1 {
		t.Errorf("cleanup failures %d, want 1", got)
	}
	if _, err := cli.ContainerRemove(ctx, holder.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}

	// An earlier process's run is swept, and counted.
	old := newExecutor(t, d, did, Config{})
	if _, err := old.Start(ctx, executor.Spec{RunID: "orphan", Runner: did, Image: d.Image()}); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Sweep(ctx, []string{"seen"}); err != nil {
		t.Fatal(err)
	}
	got = obs.snapshot()
	// The sweep took the orphan and what was left of the stuck run.
	if len(got.sweeps) != 1 || got.sweeps[0] != 2 || got.sweepErrs != 0 {
		t.Errorf("sweeps %v (errors %d), want one of 2 runs", got.sweeps, got.sweepErrs)
	}
	logMu.Lock()
	text := logs.String()
	logMu.Unlock()
	for _, want := range []string{
		"msg=\"remove run\"", "cleanup_failures_total=1",
		"msg=\"container started\"", "after=",
		"msg=\"transfer in\" run=seen dir=/work bytes=",
		"msg=\"transfer out\" run=seen dir=/work bytes=",
		"msg=\"sweep finished\" swept=2 failed=0 kept_runs=1", "swept_total=2",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the log has no %q:\n%s", want, text)
		}
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
