package live

import (
	"encoding/base64"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/fakeexec"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/mask"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/workflow"
)

// outputs writes files into a run's outputs directory.
func outputs(t *testing.T, files map[string]int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	var paths []string
	for name, size := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, name)
	}
	return dir, paths
}

// The files kept are bounded per run (how many, how many bytes), in all
// (the run kept longest goes first) and in time; a run of a check
// replaces the files of its earlier run.
func TestFilesBounds(t *testing.T) {
	t.Parallel()
	f, err := newFiles(FilesConfig{MaxFiles: 2, MaxRunBytes: 100, MaxBytes: 150, Retention: time.Hour}, filepath.Join(t.TempDir(), "files"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	f.now = func() time.Time { return now }

	dir, paths := outputs(t, map[string]int{"a": 10, "b": 95, "c": 20, "d": 30})
	got := f.keep("check-1", "r1", dir, paths, nil)
	// a (10) and c (20): b would pass the run's 100 bytes, d the 2 files.
	if diff := cmp.Diff([]output.File{{Path: "a", Size: 10}, {Path: "c", Size: 20}}, got); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
	rc, info, err := f.OpenFile("check-1", "c")
	if err != nil || info.Size != 20 {
		t.Fatalf("open c: %v %+v", err, info)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if len(b) != 20 {
		t.Errorf("c has %d bytes", len(b))
	}

	now = now.Add(time.Minute)
	dir, paths = outputs(t, map[string]int{"x": 100})
	f.keep("check-2", "r2", dir, paths, nil)
	now = now.Add(time.Minute)
	dir, paths = outputs(t, map[string]int{"y": 60})
	f.keep("check-3", "r3", dir, paths, nil)
	// 30 + 100 + 60 > 150: check-1's files (kept longest) went, then
	// check-2's.
	if f.Files("check-1") != nil || f.Files("check-2") != nil || len(f.Files("check-3")) != 1 {
		t.Errorf("after the bound on all files: %v, %v, %v", f.Files("check-1"), f.Files("check-2"), f.Files("check-3"))
	}
	if _, _, err := f.OpenFile("check-1", "a"); err != output.ErrNotFound {
		t.Errorf("a dropped file opens: %v", err)
	}

	dir, paths = outputs(t, map[string]int{"z": 1})
	f.keep("check-3", "r4", dir, paths, nil)
	if diff := cmp.Diff([]output.File{{Path: "z", Size: 1}}, f.Files("check-3")); diff != "" {
		t.Errorf("a later run's files (-want +got):\n%s", diff)
	}
	if f.runFiles("check-3", "r3") != nil {
		t.Error("the earlier run's files are listed as its")
	}
	now = now.Add(2 * time.Hour)
	if f.Files("check-3") != nil {
		t.Error("files past retention are served")
	}
	if left, _ := os.ReadDir(f.dir); len(left) != 0 {
		t.Errorf("directories left: %v", left)
	}
}

// keptBody reads a kept file of check.
func keptBody(t *testing.T, f interface {
	OpenFile(check, p string) (io.ReadSeekCloser, output.File, error)
}, check, p string) string {
	t.Helper()
	rc, _, err := f.OpenFile(check, p)
	if err != nil {
		t.Fatalf("open %s: %v", p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A kept file is copied through the run's masker: a granted value is
// masked in it as in the log, also one split across the copy's reads
// (io.Copy's 32 KiB) and one in base64; the size kept and listed is the
// masked copy's, and the run's bound holds for it. A name with a control
// or bidirectional formatting character is not kept.
func TestFilesMasked(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-value-42"
	f, err := newFiles(FilesConfig{MaxRunBytes: 40 << 10}, filepath.Join(t.TempDir(), "files"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	split := strings.Repeat("x", 32<<10-5) + secret + "\n"
	bodies := map[string]string{
		"deploy.env":      "TOKEN=" + secret + "\nB64=" + b64(secret) + "\n",
		"split.log":       split,
		"report\u202etxt": "harmless",
		"tab\tname":       "harmless",
	}
	for name, body := range bodies {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := f.keep("c", "r1", dir, []string{"deploy.env", "report\u202etxt", "split.log", "tab\tname"}, mask.NewSet([]string{secret}))
	want := []output.File{{Path: "deploy.env", Size: int64(len("TOKEN=***\nB64=***\n"))}, {Path: "split.log", Size: int64(len(split) - len(secret) + 3)}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
	if body := keptBody(t, f, "c", "deploy.env"); body != "TOKEN=***\nB64=***\n" {
		t.Errorf("deploy.env kept as %q", body)
	}
	if body := keptBody(t, f, "c", "split.log"); strings.Contains(body, "s3cret") || !strings.HasSuffix(body, "x***\n") {
		t.Errorf("split.log kept with %q at its end", body[len(body)-40:])
	}

	// A file that fits unmasked and not masked (a one-byte value
	// becomes ***) is refused, its bytes given back.
	f2, err := newFiles(FilesConfig{MaxRunBytes: 10, MaxBytes: 10}, filepath.Join(t.TempDir(), "files"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "k.txt"), []byte("kkkk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := f2.keep("c", "r1", dir, []string{"k.txt"}, mask.NewSet([]string{"k"})); len(got) != 0 || f2.total != 0 {
		t.Errorf("past the bound once masked: kept %v, %d bytes counted", got, f2.total)
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// The case on a real run (the engine on an in-memory executor,
// its log into the live stream): a trusted run whose steps write a
// rendered deploy.env with a granted secret, and a report. Without
// artifacts no file is published (kept, listed, served or pushed); with
// artifacts: [report.txt] only report.txt is, and the secret written
// into it is masked there as in the log.
func TestEndedPublishesOnlyArtifactsMasked(t *testing.T) {
	t.Parallel()
	const secret = "deploy-token-7d1c"
	ex := &fakeexec.Executor{
		Script:  func(string, string) fakeexec.Step { return fakeexec.Step{Output: "deploying with " + secret + "\n"} },
		Outputs: map[string]string{"deploy.env": "TOKEN=" + secret + "\n", "report.txt": "deployed with " + secret + "\n"},
	}
	for _, tc := range []struct {
		name      string
		artifacts string
		want      []forge.RunFile
	}{
		{"no artifacts", "", nil},
		{"artifacts: [report.txt]", "artifacts: [report.txt]\n", []forge.RunFile{{Path: "report.txt", Size: int64(len("deployed with ***\n"))}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wf, err := workflow.Parse("deploy.yaml", []byte("on: push\nsecrets: [TOKEN]\n"+tc.artifacts+"steps:\n  - run: ./deploy\n    secrets: [TOKEN]\n"))
			if err != nil {
				t.Fatal(err)
			}
			l := New(Config{Listen: "127.0.0.1:0"}, syntax.DID("did:plc:ewvi7nxzyoun6zhxrhs64oiz"), filepath.Join(t.TempDir(), "files"), Ports{}, nil)
			if err := l.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Serve())
			j := &job.Job{Key: "3kdeploy", Workflow: wf}
			// One executor for the parallel cases: a run id each.
			runID := "r" + strings.ReplaceAll(tc.name, " ", "")[:4]
			w := l.Open(j, runID, nil, nil)
			out := filepath.Join(t.TempDir(), "outputs")
			res := run.New(run.Config{Executor: ex}).Run(t.Context(), run.Request{RunID: runID, Workflow: wf, Checkout: t.TempDir(), Outputs: out,
				Trusted: true, Secrets: map[string]string{"TOKEN": secret}, Live: w})
			if res.Status != run.Success || len(res.Outputs) != 2 {
				t.Fatalf("run: %s (%s), outputs %v", res.Status, res.Error, res.Outputs)
			}
			l.Ended(j, runID, res, out)
			if diff := cmp.Diff(tc.want, l.Files(j.Key)); diff != "" {
				t.Errorf("files published (-want +got):\n%s", diff)
			}
			check := l.check(j.Key)
			if _, _, err := l.files.OpenFile(check, "deploy.env"); err != output.ErrNotFound {
				t.Errorf("deploy.env is served: %v", err)
			}
			if got := l.files.runFiles(check, runID); len(got) != len(tc.want) {
				t.Errorf("files pushed to the service: %v", got)
			}
			if tc.want != nil {
				if body := keptBody(t, l.files, check, "report.txt"); body != "deployed with ***\n" {
					t.Errorf("report.txt published as %q", body)
				}
			}
			if strings.Contains(string(res.Log), secret) {
				t.Errorf("the log shows the secret: %q", res.Log)
			}
		})
	}
}
