package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kubeexec"
)

// manySmallFiles is a tar stream shaped like a Go build cache (the one
// BenchmarkCacheGoTest restores: about 75 MiB in 1313 files): 256
// directories of files, most of them a few KiB, a few of several MiB.
// The content is random, so nothing compresses or deduplicates it.
func manySmallFiles(tb testing.TB) []byte {
	tb.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for d := range 256 {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("%02x/", d), Mode: 0o755, ModTime: epoch}); err != nil {
			tb.Fatal(err)
		}
	}
	body := make([]byte, 8<<20)
	for i := range body {
		body[i] = byte(rng.Uint32())
	}
	for i := range 1313 {
		size := 200 + rng.IntN(4<<10) // mostly small: action records, small outputs
		switch {
		case i%200 == 0:
			size = 4<<20 + rng.IntN(4<<20) // large packages
		case i%20 == 0:
			size = 128<<10 + rng.IntN(768<<10) // compiled packages
		}
		off := rng.IntN(len(body) - size)
		name := fmt.Sprintf("%02x/%064x-d", i%256, i)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(size), ModTime: epoch}); err != nil {
			tb.Fatal(err)
		}
		if _, err := tw.Write(body[off : off+size]); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkRestoreSmallFiles compares a cache restore (Put of a tar
// stream of many small files into a cache directory) with the raw
// baseline the restore cannot beat: the same stream over one exec into
// `tar -x` in the pod, unpacked on the same volume. Both sides are
// measured alternately; restore/raw is the ratio of their throughputs:
//
//	go test ./internal/executor/kubernetes -run XXX -bench RestoreSmallFiles -benchtime 5x
func BenchmarkRestoreSmallFiles(b *testing.B) {
	_, s := benchSessionWith(b, executor.Spec{Caches: []string{"/cache"}})
	ctx := context.Background()
	stream := manySmallFiles(b)
	sh := func(script string, args ...string) {
		var stderr bytes.Buffer
		if code, err := s.exec(ctx, append([]string{"sh", "-c", script, "sh"}, args...), kubeexec.Streams{Stderr: &stderr}); err != nil || code != 0 {
			b.Fatalf("%s: %d %v %s", script, code, err, stderr.String())
		}
	}
	var raw, put time.Duration
	b.SetBytes(int64(len(stream)))
	for i := 0; b.Loop(); i++ {
		rawDir, putDir := "/cache/raw"+strconv.Itoa(i), "/cache/put"+strconv.Itoa(i)
		t0 := time.Now()
		var stderr bytes.Buffer
		if code, err := s.exec(ctx, []string{"sh", "-c", `mkdir -p "$1" && tar -xf - -C "$1"`, "sh", rawDir}, kubeexec.Streams{Stdin: bytes.NewReader(stream), Stderr: &stderr}); err != nil || code != 0 {
			b.Fatalf("raw tar -x: %d %v %s", code, err, stderr.String())
		}
		t1 := time.Now()
		if err := s.Put(ctx, putDir, bytes.NewReader(stream)); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		raw, put = raw+t1.Sub(t0), put+t2.Sub(t1)
		b.StopTimer()
		sh(`[ "$(find "$1" | wc -l)" = "$(find "$2" | wc -l)" ] && rm -rf "$1" "$2"`, rawDir, putDir)
		b.StartTimer()
	}
	mib := float64(len(stream)) / (1 << 20) * float64(b.N)
	b.ReportMetric(float64(len(stream))/(1<<20), "stream-MiB")
	b.ReportMetric(mib/raw.Seconds(), "raw-tar-MiB/s")
	b.ReportMetric(mib/put.Seconds(), "restore-MiB/s")
	b.ReportMetric(raw.Seconds()/put.Seconds(), "restore/raw")
}
