// Package atomicfile replaces a file so that a reader sees the old
// content or the new one, never a part, and a crash leaves one of the
// two: the runner's state.json and key, and the kubeconfigs it mints.
// The temporary file, its mode and the rename are renameio's; this
// package adds the fsync of the directory, which makes the rename itself
// survive a crash.
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// Write replaces path with data, with exactly mode (no umask): a
// temporary file in the same directory, fsync, rename, fsync of the
// directory. On an error the temporary file is removed and path is as
// it was.
func Write(path string, data []byte, mode fs.FileMode) error {
	dir := filepath.Dir(path)
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(mode))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
