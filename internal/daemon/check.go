package daemon

import (
	"context"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"knotless.dev/run/internal/checks"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/run"
)

// Limits of what a check carries.
const (
	maxOutputs    = 16
	maxOutputSize = 1_000_000
)

// finalCheck maps a run's result onto the check record, uploading the
// log and the image outputs as blobs.
func (d *Daemon) finalCheck(ctx context.Context, j *job, res *run.Result, log *slog.Logger) forge.Check {
	c := j.check
	c.Status = string(res.Status)
	c.StartedAt = forge.Datetime(res.StartedAt)
	c.FinishedAt = forge.Datetime(res.FinishedAt)
	c.FailedStep = checks.Truncate(res.FailedStep, checks.MaxName)
	c.Error = checks.Truncate(res.Error, checks.MaxError)
	c.Steps = nil
	for _, s := range res.Steps {
		cs := forge.CheckStep{Name: checks.Truncate(s.Name, checks.MaxName), Status: string(s.Status), DurationMs: s.Duration.Milliseconds(), TimedOut: s.TimedOut}
		if s.ExitCode != nil {
			code := int64(*s.ExitCode)
			cs.ExitCode = &code
		}
		c.Steps = append(c.Steps, cs)
	}
	if len(res.Log) > 0 {
		blob, err := d.blobs.UploadBlob(ctx, "text/plain", res.Log)
		if err != nil {
			log.Error("upload run log", "err", err)
		} else {
			c.Log = &blob
		}
	}
	outDir := filepath.Join(d.cfg.CacheDir, "runs", j.runID, "outputs")
	for _, rel := range res.Outputs {
		if len(c.Outputs) == maxOutputs {
			log.Warn("more image outputs than a check holds; the rest are not uploaded", "max", maxOutputs)
			break
		}
		data, mimeType, ok := readImage(filepath.Join(outDir, filepath.FromSlash(rel)))
		if !ok {
			continue
		}
		blob, err := d.blobs.UploadBlob(ctx, mimeType, data)
		if err != nil {
			log.Error("upload output", "path", rel, "err", err)
			continue
		}
		c.Outputs = append(c.Outputs, forge.Output{Path: rel, Blob: blob})
	}
	return c
}

// readImage reads an output file when it is an image small enough for a
// check; the type comes from the content, not the name alone.
func readImage(name string) ([]byte, string, bool) {
	fi, err := os.Lstat(name)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > maxOutputSize {
		return nil, "", false
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, "", false
	}
	sniffed := http.DetectContentType(data)
	if strings.HasPrefix(sniffed, "image/") {
		return data, sniffed, true
	}
	if byExt := mime.TypeByExtension(path.Ext(name)); byExt == "image/svg+xml" {
		return data, byExt, true
	}
	return nil, "", false
}
