package clustertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// Image says what goes into an image BuildImage makes.
type Image struct {
	Name       string            // reference, e.g. knotless.test/runner-NS:1
	Files      map[string]string // path in the image -> file of the host
	Busybox    bool              // the host's busybox with its applets (sh, ...)
	Entrypoint []string
}

// BuildImage makes a one-layer image of host files with the harness's
// mkimage (as `up` makes the busybox image), imports it into the node's
// containerd, and removes it when the test ends. Pods use it with pull
// policy IfNotPresent (the default for a tag other than latest) or Never.
func (c *Cluster) BuildImage(t testing.TB, img Image) {
	t.Helper()
	if c.Info.Dir == "" || c.Info.ContainerdSock == "" {
		t.Fatalf("clustertest: build image: %v", errNoNodeInfo)
	}
	bin, err := os.ReadFile(filepath.Join(c.Info.Dir, "state", "bin"))
	if err != nil {
		t.Fatalf("clustertest: find the harness's binaries: %v", err)
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	args := []string{"-name", img.Name, "-out", archive}
	dsts := make([]string, 0, len(img.Files))
	for dst := range img.Files {
		dsts = append(dsts, dst)
	}
	sort.Strings(dsts)
	for _, dst := range dsts {
		args = append(args, "-add", img.Files[dst]+"="+dst)
	}
	if img.Busybox {
		bb, err := exec.LookPath("busybox")
		if err != nil {
			t.Fatalf("clustertest: build image: %v", err)
		}
		args = append(args, "-add", bb+"=/bin/busybox", "-busybox", bb)
	}
	for _, e := range img.Entrypoint {
		args = append(args, "-entrypoint", e)
	}
	mkimage := filepath.Join(strings.TrimSpace(string(bin)), "mkimage")
	if out, err := exec.Command(mkimage, args...).CombinedOutput(); err != nil {
		t.Fatalf("clustertest: mkimage %s: %v: %s", img.Name, err, out)
	}
	c.ImportImage(t, archive, img.Name)
}

// ImportImage imports an OCI image archive (one image, named name) into
// the node's containerd, as `up` imports its images, and removes the
// image when the test ends.
func (c *Cluster) ImportImage(t testing.TB, archive, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := c.ctr(ctx, "--timeout", "60s", "images", "import", archive); err != nil {
		t.Fatalf("clustertest: import %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.RemoveImage(ctx, name); err != nil {
			t.Errorf("clustertest: %v", err)
		}
	})
}

// LibraryClosure returns the shared libraries and loader that the host's
// binaries load (by ldd), each at its own path, for an image that runs them.
func LibraryClosure(binaries ...string) (map[string]string, error) {
	files := map[string]string{}
	for _, b := range binaries {
		out, err := exec.Command("ldd", b).Output()
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %w", b, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			var p string
			switch {
			case len(f) >= 3 && f[1] == "=>":
				p = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				p = f[0]
			}
			if strings.HasPrefix(p, "/") {
				files[p] = p
			}
		}
	}
	return files, nil
}
