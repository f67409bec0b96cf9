package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/md5"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeexec"
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
// baseline: the same stream over one exec straight into `tar -x` in the
// pod, unpacked on the same volume. digest/raw is the same for the
// restore as it was until 2026-12-05 (stagedPutScript: the stream staged
// in the transfer volume, MD5 on both ends, then unpacked), measured in
// the same run. The three are measured alternately, each first in turn;
// each ratio is of throughputs (use a multiple of 3 for -benchtime):
//
//	go test ./internal/executor/kubernetes -run XXX -bench RestoreSmallFiles -benchtime 9x
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
	var raw, put, digest time.Duration
	arms := []struct {
		name  string
		total *time.Duration
		into  func(dir string) error
	}{
		{"raw", &raw, func(dir string) error {
			var stderr bytes.Buffer
			code, err := s.exec(ctx, []string{"sh", "-c", `mkdir -p "$1" && tar -xf - -C "$1"`, "sh", dir}, kubeexec.Streams{Stdin: bytes.NewReader(stream), Stderr: &stderr})
			if err == nil && code != 0 {
				err = fmt.Errorf("exit %d: %s", code, stderr.String())
			}
			return err
		}},
		{"put", &put, func(dir string) error { return s.Put(ctx, dir, bytes.NewReader(stream)) }},
		{"digest", &digest, func(dir string) error {
			h := md5.New()
			var stderr bytes.Buffer
			code, err := s.exec(ctx, []string{"sh", "-c", stagedPutScript, "knotless-put", dir}, kubeexec.Streams{Stdin: io.TeeReader(bytes.NewReader(stream), h), Stderr: &stderr})
			if err == nil {
				err = checkDigest(code, stderr.String(), h.Sum(nil))
			}
			return err
		}},
	}
	b.SetBytes(int64(len(stream)))
	for i := 0; b.Loop(); i++ {
		// The arm after another one's unpack pays for writing back its
		// dirty pages: the order turns round each iteration.
		var dirs []string
		for j := range arms {
			arm := arms[(i+j)%len(arms)]
			dir := "/cache/" + arm.name + strconv.Itoa(i)
			t0 := time.Now()
			if err := arm.into(dir); err != nil {
				b.Fatalf("%s: %v", arm.name, err)
			}
			*arm.total += time.Since(t0)
			dirs = append(dirs, dir)
		}
		b.StopTimer()
		sh(`n=$(find "$1" | wc -l) && [ "$(find "$2" | wc -l)" = "$n" ] && [ "$(find "$3" | wc -l)" = "$n" ] && rm -rf "$1" "$2" "$3"`, dirs...)
		b.StartTimer()
	}
	mib := float64(len(stream)) / (1 << 20) * float64(b.N)
	b.ReportMetric(float64(len(stream))/(1<<20), "stream-MiB")
	b.ReportMetric(mib/raw.Seconds(), "raw-tar-MiB/s")
	b.ReportMetric(mib/put.Seconds(), "restore-MiB/s")
	b.ReportMetric(raw.Seconds()/put.Seconds(), "restore/raw")
	b.ReportMetric(raw.Seconds()/digest.Seconds(), "digest/raw")
}

// stagedPutScript is the transfer in as it was until 2026-12-05, kept
// here only to compare with in the benchmark: the stream staged whole in
// the transfer volume, hashed with md5sum in a pass of its own, then
// unpacked; the runner compares the digest with its own.
const stagedPutScript = `set -eu
dir=$1
mkdir -p "$dir"
f=/knotless/transfer/put.$$
trap 'rm -f "$f"' EXIT
cat > "$f"
sum=$(md5sum < "$f")
tar -xf "$f" -C "$dir"
echo "knotless: digest ${sum%% *}" >&2
`
