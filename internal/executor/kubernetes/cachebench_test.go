package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"knotless.dev/run/internal/engine/cache"
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeexec"
	"knotless.dev/run/internal/rules/workflow"
	"knotless.dev/run/tests/clustertest"
)

// goModule is the real module whose own tests the cache benchmark runs:
// github.com/google/go-cmp, from this machine's module cache.
const goModule = "github.com/google/go-cmp@v0.7.0"

// BenchmarkCacheGoTest runs go-cmp's test suite as a Kubernetes run,
// cold and then warm, with GOCACHE under the cache path /cache, and
// reports warm/cold (end to end, session start to stop) and the restore
// of the cache (Put of the stored tar stream) against raw `wc -c` over
// exec of the same bytes:
//
//	go test ./internal/executor/kubernetes -run XXX -bench CacheGoTest -benchtime 1x
//
// The run image is the test image with this machine's Go toolchain
// added as a layer, imported into the node's containerd for the
// benchmark and removed after it.
func BenchmarkCacheGoTest(b *testing.B) {
	c := clustertest.Start(b)
	ctx := context.Background()
	image := goImage(b, c)
	ex, err := New(Config{
		Credentials: Credentials{Kubeconfig: c.Kubeconfig, Namespace: c.Namespace},
		Runner:      "did:plc:bench", Pod: PodOptions{Image: image}, ScheduleTimeout: 2 * time.Minute,
	})
	if err != nil {
		b.Fatal(err)
	}
	store, err := cache.Open(cache.Config{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	eng := run.New(run.Config{Executor: ex, DefaultImage: image, Runner: "did:plc:bench", Caches: store, CleanupTimeout: 2 * time.Minute})
	gomodcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		b.Fatal(err)
	}
	checkout := b.TempDir()
	copyTree(b, filepath.Join(strings.TrimSpace(string(gomodcache)), goModule), checkout)
	wf, err := workflow.Parse("bench.yaml", []byte(`on: push
cache: [/cache]
env:
  GOCACHE: /cache/go-build
  GOPATH: /tmp/gopath
  GOTOOLCHAIN: local
  GOENV: "off"
  GOFLAGS: -mod=mod
  CGO_ENABLED: "0"
steps:
  - name: test
    run: |
      export PATH=/usr/local/go/bin:$PATH
      go test -count=1 ./...
`))
	if err != nil {
		b.Fatal(err)
	}
	var cold, warm, rawIn, restore time.Duration
	var restored int64
	for i := 0; b.Loop(); i++ {
		scope := run.CacheScope{Repo: "bench-" + strconv.Itoa(i) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
		for j, total := range []*time.Duration{&cold, &warm} {
			scope.Order = strconv.Itoa(j)
			res := eng.Run(ctx, run.Request{RunID: "cb" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36), Workflow: wf, Checkout: checkout, Trusted: true, Cache: scope})
			if res.Status != run.Success {
				b.Fatalf("run %d: %s (%s)\n%s", j, res.Status, res.Error, res.Log)
			}
			*total += res.FinishedAt.Sub(res.StartedAt)
			b.Logf("run %d took %s\n%s", j, res.FinishedAt.Sub(res.StartedAt).Round(time.Millisecond), res.Log)
		}
		// The restore alone, in a session of its own, against raw exec.
		f, _, err := store.Base(cache.Key{Repo: scope.Repo, Workflow: wf.Name, Path: "/cache"}, true)
		if err != nil {
			b.Fatal(err)
		}
		stream, err := io.ReadAll(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		sess, err := ex.Start(ctx, executor.Spec{RunID: "cr" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36), Runner: "did:plc:bench", Image: image, Caches: []string{"/cache"}})
		if err != nil {
			b.Fatal(err)
		}
		s := sess.(*Session)
		t0 := time.Now()
		var count bytes.Buffer
		if code, err := s.exec(ctx, []string{"wc", "-c"}, kubeexec.Streams{Stdin: bytes.NewReader(stream), Stdout: &count}); err != nil || code != 0 || strings.TrimSpace(count.String()) != strconv.Itoa(len(stream)) {
			b.Fatalf("raw in: %d %v, %q bytes arrived", code, err, count.String())
		}
		t1 := time.Now()
		if err := s.Put(ctx, "/cache", bytes.NewReader(stream)); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := s.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		rawIn, restore, restored = rawIn+t1.Sub(t0), restore+t2.Sub(t1), restored+int64(len(stream))
	}
	b.ReportMetric(cold.Seconds()/float64(b.N), "cold-s/op")
	b.ReportMetric(warm.Seconds()/float64(b.N), "warm-s/op")
	b.ReportMetric(warm.Seconds()/cold.Seconds(), "warm/cold")
	b.ReportMetric(float64(restored)/float64(b.N)/(1<<20), "cache-MiB")
	b.ReportMetric(float64(restored)/(1<<20)/restore.Seconds(), "restore-MiB/s")
	b.ReportMetric(rawIn.Seconds()/restore.Seconds(), "restore/raw")
}

// copyTree copies the regular files and directories under from into to,
// writable (the module cache's are read-only).
func copyTree(b *testing.B, from, to string) {
	b.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		body, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, body, 0o644)
	})
	if err != nil {
		b.Fatal(err)
	}
}

// goImage imports into the node's containerd an image of the run image's
// busybox with this machine's GOROOT at /usr/local/go, and removes it
// after the benchmark.
func goImage(b *testing.B, c *clustertest.Cluster) string {
	b.Helper()
	if c.Info.ContainerdSock == "" {
		b.Skip("the cluster's containerd socket is unknown (tests/cluster/env)")
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	layer, err := os.Create(filepath.Join(dir, "layer.tar"))
	if err != nil {
		b.Fatal(err)
	}
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(layer, h))
	epoch := time.Unix(0, 0)
	if err := addBusybox(tw, epoch); err != nil {
		b.Fatal(err)
	}
	root := strings.TrimSpace(string(goroot))
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		name := "usr/local/go"
		if rel != "." {
			name += "/" + filepath.ToSlash(rel)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: epoch})
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: epoch})
		case d.Type().IsRegular():
			mode := int64(0o644)
			if fi.Mode()&0o111 != 0 {
				mode = 0o755
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: fi.Size(), ModTime: epoch}); err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = layer.Close()
	}
	if err != nil {
		b.Fatal(err)
	}
	layerHex := hex.EncodeToString(h.Sum(nil))
	name := "knotless.test/go-" + c.Namespace + ":1"
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux", "created": epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{"Env": []string{"PATH=/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin"}, "Cmd": []string{"sh"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerHex}},
	})
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, _ := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{name}, "Layers": []string{layerHex + "/layer.tar"}}})
	archive := filepath.Join(dir, "image.tar")
	af, err := os.Create(archive)
	if err != nil {
		b.Fatal(err)
	}
	aw := tar.NewWriter(af)
	lf, err := os.Open(filepath.Join(dir, "layer.tar"))
	if err != nil {
		b.Fatal(err)
	}
	lfi, _ := lf.Stat()
	err = aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: layerHex + "/layer.tar", Mode: 0o644, Size: lfi.Size(), ModTime: epoch})
	if err == nil {
		_, err = io.Copy(aw, lf)
	}
	lf.Close()
	for _, f := range []struct {
		name string
		body []byte
	}{{configName, config}, {"manifest.json", manifest}} {
		if err == nil {
			err = aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: epoch})
		}
		if err == nil {
			_, err = aw.Write(f.body)
		}
	}
	if err == nil {
		err = aw.Close()
	}
	if cerr := af.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatal(err)
	}
	ctr := func(args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.Info.ContainerdSock, "-n", "k8s.io"}, args...)...).CombinedOutput()
		if err != nil {
			return &ctrError{args, err, string(out)}
		}
		return nil
	}
	if err := ctr("images", "import", "--no-unpack=false", archive); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := ctr("images", "rm", "--sync", name); err != nil {
			b.Error(err)
		}
	})
	return name
}

type ctrError struct {
	args []string
	err  error
	out  string
}

func (e *ctrError) Error() string {
	return "ctr " + strings.Join(e.args, " ") + ": " + e.err.Error() + ": " + e.out
}

// addBusybox writes the host's static busybox with its applets, and the
// directories a run needs, as the test image has them.
func addBusybox(tw *tar.Writer, epoch time.Time) error {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return err
	}
	list, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return err
	}
	for _, d := range []struct {
		name string
		mode int64
	}{{"bin", 0o755}, {"dev", 0o755}, {"etc", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"tmp", 0o1777}, {"usr", 0o755}, {"usr/bin", 0o755}, {"usr/local", 0o755}, {"var", 0o755}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name + "/", Mode: d.mode, ModTime: epoch}); err != nil {
			return err
		}
	}
	passwd := []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
	for _, f := range []struct {
		name string
		body []byte
		mode int64
	}{{"bin/busybox", bb, 0o755}, {"etc/passwd", passwd, 0o644}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.body)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(f.body); err != nil {
			return err
		}
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
			return err
		}
	}
	return nil
}
