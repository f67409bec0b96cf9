// Command mkimage writes a one-layer OCI image archive (an OCI image layout
// in a tar file) that `ctr images import` accepts, from files of the host.
// The test cluster builds its images with it, so it needs no registry:
//
//	mkimage -name knotless.test/busybox:1 -out busybox.tar \
//	    -add /bin/busybox=/bin/busybox -busybox /bin/busybox -cmd sh
//	mkimage -name knotless.test/pause:1 -out pause.tar \
//	    -add ./pause=/pause -entrypoint /pause
//
// The archive is reproducible: every time stamp is zero and every owner root.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

type options struct {
	name       string
	out        string
	adds       listFlag
	busybox    string
	cmd        listFlag
	entrypoint listFlag
}

func main() {
	var o options
	flag.StringVar(&o.name, "name", "", "image reference to record, e.g. knotless.test/busybox:1")
	flag.StringVar(&o.out, "out", "", "archive to write")
	flag.Var(&o.adds, "add", "SRC=DST: put host file SRC at DST in the image (repeatable)")
	flag.StringVar(&o.busybox, "busybox", "", "busybox binary whose applets become symlinks to /bin/busybox")
	flag.Var(&o.cmd, "cmd", "an element of the image's Cmd (repeatable)")
	flag.Var(&o.entrypoint, "entrypoint", "an element of the image's Entrypoint (repeatable)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// entry is one file, directory or symlink of the layer.
type entry struct {
	name string // without a leading slash
	mode int64
	link string // symlink target, for a symlink
	data []byte // content, for a file
	dir  bool
}

func run(o options) error {
	if o.name == "" || o.out == "" {
		return errors.New("-name and -out are required")
	}
	entries := map[string]entry{}
	for _, d := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "proc", "sys", "dev", "run", "var"} {
		entries[d] = entry{name: d, mode: 0o755, dir: true}
	}
	entries["tmp"] = entry{name: "tmp", mode: 0o1777, dir: true}
	entries["etc/passwd"] = entry{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")}
	entries["etc/group"] = entry{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")}
	for _, a := range o.adds {
		src, dst, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("parse -add %q: want SRC=DST", a)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("read file to add: %w", err)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("stat file to add: %w", err)
		}
		name := strings.TrimPrefix(path.Clean(dst), "/")
		addParents(entries, name)
		entries[name] = entry{name: name, mode: int64(fi.Mode().Perm()), data: data}
	}
	if o.busybox != "" {
		out, err := exec.Command(o.busybox, "--list-full").Output()
		if err != nil {
			return fmt.Errorf("list busybox applets: %w", err)
		}
		for _, applet := range strings.Fields(string(out)) {
			name := strings.TrimPrefix(path.Clean(applet), "/")
			if _, taken := entries[name]; taken {
				continue
			}
			addParents(entries, name)
			entries[name] = entry{name: name, mode: 0o777, link: "/bin/busybox"}
		}
	}
	layer, err := layerTar(entries)
	if err != nil {
		return err
	}
	archive, err := ociArchive(o, layer)
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.out, archive, 0o644); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	return nil
}

func addParents(entries map[string]entry, name string) {
	for dir := path.Dir(name); dir != "." && dir != "/"; dir = path.Dir(dir) {
		if _, ok := entries[dir]; !ok {
			entries[dir] = entry{name: dir, mode: 0o755, dir: true}
		}
	}
}

func layerTar(entries map[string]entry) ([]byte, error) {
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names) // parents sort before their children
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, e.name+"/"
		case e.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("write layer header %s: %w", e.name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				return nil, fmt.Errorf("write layer file %s: %w", e.name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer: %w", err)
	}
	return buf.Bytes(), nil
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ociArchive wraps the layer into an OCI image layout and tars it.
func ociArchive(o options, layer []byte) ([]byte, error) {
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config": map[string]any{
			"Env":        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Cmd":        []string(o.cmd),
			"Entrypoint": []string(o.entrypoint),
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digest(layer)}},
	})
	if err != nil {
		return nil, fmt.Errorf("encode image config: %w", err)
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: digest(config), Size: int64(len(config))},
		"layers":        []descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: digest(layer), Size: int64(len(layer))}},
	})
	if err != nil {
		return nil, fmt.Errorf("encode image manifest: %w", err)
	}
	tag := o.name[strings.LastIndex(o.name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []descriptor{{
			MediaType: "application/vnd.oci.image.manifest.v1+json",
			Digest:    digest(manifest),
			Size:      int64(len(manifest)),
			Annotations: map[string]string{
				"io.containerd.image.name":          o.name,
				"org.opencontainers.image.ref.name": tag,
			},
			Platform: map[string]string{"architecture": "amd64", "os": "linux"},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("encode image index: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"blobs/sha256/" + strings.TrimPrefix(digest(config), "sha256:"), config},
		{"blobs/sha256/" + strings.TrimPrefix(digest(manifest), "sha256:"), manifest},
		{"blobs/sha256/" + strings.TrimPrefix(digest(layer), "sha256:"), layer},
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, fmt.Errorf("write archive dir: %w", err)
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, fmt.Errorf("write archive header %s: %w", f.name, err)
		}
		if _, err := io.Copy(tw, bytes.NewReader(f.data)); err != nil {
			return nil, fmt.Errorf("write archive file %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close archive: %w", err)
	}
	return buf.Bytes(), nil
}
