package checks

import (
	"context"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/run"
)

// Limits of what a check carries.
const (
	maxOutputs    = 16
	maxOutputSize = 1_000_000
)

// Map maps a run's result onto its check c, one to one: status, times,
// failed step, error, steps with their exit codes and durations, the
// log and the image outputs (read from outDir, where the run's outputs
// are) uploaded as blobs. A blob that does not upload is logged and
// left out.
func (k *Keeper) Map(ctx context.Context, c forge.Check, res *run.Result, outDir string, log *slog.Logger) forge.Check {
	c.Status = string(res.Status)
	c.StartedAt = forge.Datetime(res.StartedAt)
	c.FinishedAt = forge.Datetime(res.FinishedAt)
	c.FailedStep = Truncate(res.FailedStep, MaxName)
	c.Error = Truncate(res.Error, MaxError)
	c.Steps = nil
	for _, s := range res.Steps {
		cs := forge.CheckStep{Name: Truncate(s.Name, MaxName), Status: string(s.Status), DurationMs: s.Duration.Milliseconds(), TimedOut: s.TimedOut}
		if s.ExitCode != nil {
			code := int64(*s.ExitCode)
			cs.ExitCode = &code
		}
		c.Steps = append(c.Steps, cs)
	}
	if len(res.Log) > 0 {
		blob, err := k.blobs.UploadBlob(ctx, "text/plain", res.Log)
		if err != nil {
			log.Error("upload run log", "err", err)
		} else {
			c.Log = &blob
		}
	}
	for _, rel := range res.Outputs {
		if len(c.Outputs) == maxOutputs {
			log.Warn("more image outputs than a check holds; the rest are not uploaded", "max", maxOutputs)
			break
		}
		data, mimeType, ok := readImage(filepath.Join(outDir, filepath.FromSlash(rel)))
		if !ok {
			continue
		}
		blob, err := k.blobs.UploadBlob(ctx, mimeType, data)
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
