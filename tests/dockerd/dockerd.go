// Package dockerd starts private Docker daemons for tests: Debian's
// dockerd with its own data root, exec root, socket, managed containerd,
// cgroup parent and network namespace, and a busybox image built from
// the host's busybox-static and loaded through the Engine API. Nothing is
// pulled from a registry.
//
// Each daemon lives in the network namespace knotless-dockerd-ID, so its
// bridges and iptables chains, ip_forward and FORWARD policy never touch
// the host's, and in a private mount namespace, so its mounts go away
// with its processes. Its processes and its containers' are found again
// by that namespace and by the cgroup /knotless-dockerd-ID; a daemon
// whose test process died (kill -9) is cleaned up by the next Start.
package dockerd

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"knotless.dev/run/tests/internal/hostclean"
)

// Base holds one directory per daemon, named by its id.
const Base = "/tmp/knotless-dockerd"

// Image is the test image every daemon has: busybox with its applets
// linked into /bin, a root user, and /tmp.
const Image = "knotless.test/busybox:1"

// prefix names a daemon's network namespace and cgroup.
const prefix = "knotless-dockerd-"

// AddressPool is where the daemon takes its networks' subnets from; it
// exists only in the daemon's own network namespace.
const AddressPool = "172.30.0.0/16"

// Daemon is one private dockerd.
type Daemon struct {
	id     string
	dir    string
	lock   *os.File
	pid    int
	exited chan struct{} // closed when dockerd has exited
	log    *os.File
	stop   sync.Once
	err    error
}

// Host is the daemon's address, for DOCKER_HOST.
func (d *Daemon) Host() string { return "unix://" + d.socket() }

// Image is the name of the test image.
func (d *Daemon) Image() string { return Image }

// Dir is the daemon's directory; DataRoot and ExecRoot are inside it.
func (d *Daemon) Dir() string { return d.dir }

// DataRoot is the daemon's --data-root: every file of its containers and
// volumes on the host side.
func (d *Daemon) DataRoot() string { return filepath.Join(d.dir, "data") }

// ExecRoot is the daemon's --exec-root, with its containerd's state.
func (d *Daemon) ExecRoot() string { return filepath.Join(d.dir, "x") }

// Netns is the name of the daemon's network namespace.
func (d *Daemon) Netns() string { return prefix + d.id }

// Cgroup is the daemon's cgroup parent, under each hierarchy's root.
func (d *Daemon) Cgroup() string { return prefix + d.id }

func (d *Daemon) socket() string { return filepath.Join(d.dir, "d.sock") }

// Client returns an Engine API client for the daemon.
func (d *Daemon) Client() (*client.Client, error) {
	return client.New(client.WithHost(d.Host()))
}

// Start starts a private daemon for t and stops it when t ends. Under
// -short it skips t.
func Start(t testing.TB) *Daemon {
	t.Helper()
	skipShort(t)
	d, err := New(context.Background())
	if err != nil {
		t.Fatalf("private dockerd: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("stop private dockerd: %v", err)
		}
	})
	return d
}

func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: this test needs a private dockerd (root, Debian's docker.io); run without -short to run it")
	}
}

// Shared is one daemon for a whole test package: TestMain calls Main,
// tests call Get. The daemon starts at the first Get.
type Shared struct {
	mu      sync.Mutex
	started bool
	d       *Daemon
	err     error
}

// Main runs the package's tests and stops the daemon after them.
func (s *Shared) Main(m *testing.M) int {
	flag.Parse()
	code := m.Run()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.d != nil {
		if err := s.d.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop private dockerd: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Get returns the package's daemon, starting it at the first call. Under
// -short it skips t.
func (s *Shared) Get(t testing.TB) *Daemon {
	t.Helper()
	skipShort(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.started = true
		s.d, s.err = New(context.Background())
	}
	if s.err != nil {
		t.Fatalf("private dockerd: %v", s.err)
	}
	return s.d
}

// New starts a private daemon and loads the test image. It first cleans
// up after daemons whose test process is gone.
func New(ctx context.Context) (*Daemon, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a private dockerd needs root")
	}
	for _, bin := range []struct{ name, pkg string }{
		{"dockerd", "docker.io"}, {"containerd", "containerd"}, {"runc", "runc"}, {"docker-init", "tini"},
		{"unshare", "util-linux"}, {"nsenter", "util-linux"}, {"ip", "iproute2"}, {"iptables", "iptables"},
	} {
		if _, err := exec.LookPath(bin.name); err != nil {
			return nil, fmt.Errorf("%s not found: install Debian's %s (tests/dockerd/install)", bin.name, bin.pkg)
		}
	}
	image, err := busyboxImage()
	if err != nil {
		return nil, err
	}
	d, err := create()
	if err != nil {
		return nil, err
	}
	if err := d.start(ctx, image); err != nil {
		return nil, errors.Join(err, d.Stop())
	}
	return d, nil
}

// create cleans up dead daemons and makes a new daemon's directory and
// lock, under a lock on Base so that no two test processes race.
func create() (*Daemon, error) {
	global, err := lockBase()
	if err != nil {
		return nil, err
	}
	defer global.Close()
	if err := cleanDead(); err != nil {
		return nil, fmt.Errorf("clean up after earlier daemons: %w", err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	d := &Daemon{id: hex.EncodeToString(b), exited: make(chan struct{})}
	d.dir = filepath.Join(Base, d.id)
	if err := os.Mkdir(d.dir, 0o700); err != nil {
		return nil, err
	}
	if d.lock, err = hostclean.LockDir(d.dir); err != nil {
		return nil, errors.Join(err, os.RemoveAll(d.dir))
	}
	if d.lock == nil {
		return nil, errors.Join(fmt.Errorf("new daemon directory %s is locked", d.dir), os.RemoveAll(d.dir))
	}
	return d, nil
}

// Clean removes what the daemons of dead test processes left: processes,
// mounts, network namespaces, cgroups, shim sockets and directories.
// Daemons of live test processes are left alone.
func Clean() error {
	if _, err := os.Stat(Base); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	global, err := lockBase()
	if err != nil {
		return err
	}
	defer global.Close()
	return cleanDead()
}

// lockBase takes the lock on Base that creating and cleaning up daemons
// hold; closing the file releases it.
func lockBase() (*os.File, error) { return hostclean.LockBase(Base) }

// cleanDead cleans every daemon whose directory lock no live process
// holds.
func cleanDead() error {
	return hostclean.CleanDead(Base, nil, func(id string) error {
		d := &Daemon{id: id, dir: filepath.Join(Base, id)}
		return d.clean()
	})
}

// start runs dockerd in the daemon's namespaces and cgroup, waits for
// its API and loads the test image.
func (d *Daemon) start(ctx context.Context, image []byte) error {
	if out, err := exec.Command("ip", "netns", "add", d.Netns()).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %v: %s", d.Netns(), err, out)
	}
	if out, err := exec.Command("ip", "-n", d.Netns(), "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set lo up: %v: %s", err, out)
	}
	procs, err := d.daemonCgroup()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(d.dir, "daemon.json"), []byte("{}\n"), 0o600); err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(d.dir, "dockerd.log"))
	if err != nil {
		return err
	}
	d.log = log
	args := []string{
		"-c", `echo $$ >"$0" && exec "$@"`, procs,
		"unshare", "--mount", "--propagation", "private",
		"nsenter", "--net=/run/netns/" + d.Netns(), "--",
		"dockerd",
		"--config-file", filepath.Join(d.dir, "daemon.json"),
		"--data-root", d.DataRoot(),
		"--exec-root", d.ExecRoot(),
		"--pidfile", filepath.Join(d.dir, "dockerd.pid"),
		"--host", d.Host(),
		"--cgroup-parent", "/" + d.Cgroup(),
		"--exec-opt", "native.cgroupdriver=cgroupfs",
		"--oom-score-adjust", "0",
		"--iptables=true",
		"--ip-forward=true",
		"--bridge", "none",
		"--default-address-pool", "base=" + AddressPool + ",size=24",
		"--userland-proxy=false",
	}
	cmd := exec.Command("sh", args...)
	cmd.Stdout, cmd.Stderr = log, log
	if d.pid, err = hostclean.Start(cmd, d.exited); err != nil {
		return fmt.Errorf("start dockerd: %w", err)
	}
	cli, err := d.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(90 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true})
		cancel()
		if err == nil {
			break
		}
		select {
		case <-d.exited:
			return fmt.Errorf("dockerd exited at start:\n%s", d.logTail())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dockerd did not answer within 90s: %v\n%s", err, d.logTail())
		}
	}
	res, err := cli.ImageLoad(ctx, bytes.NewReader(image), client.ImageLoadWithQuiet(true))
	if err != nil {
		return fmt.Errorf("load test image: %w", err)
	}
	defer res.Close()
	msgs, err := io.ReadAll(res)
	if err != nil {
		return fmt.Errorf("load test image: %w", err)
	}
	if bytes.Contains(msgs, []byte(`"error"`)) {
		return fmt.Errorf("load test image: %s", msgs)
	}
	return nil
}

func (d *Daemon) logTail() string {
	b, _ := os.ReadFile(filepath.Join(d.dir, "dockerd.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Kill kills dockerd alone with SIGKILL, as a crash would: its
// containerd, shims and containers go on. Stop still cleans up after it.
func (d *Daemon) Kill() error {
	if d.pid == 0 {
		return errors.New("dockerd is not running")
	}
	if err := syscall.Kill(d.pid, syscall.SIGKILL); err != nil {
		return err
	}
	<-d.exited
	return nil
}

// Stop stops dockerd and removes everything of the daemon: processes
// (its containerd, shims and containers too, also after a crash),
// mounts, the network namespace with its links and iptables chains,
// cgroups, shim sockets and the directory. It is safe to call more than
// once.
func (d *Daemon) Stop() error {
	d.stop.Do(func() {
		hostclean.Stop(d.pid, d.exited, 30*time.Second)
		d.err = d.clean()
		if d.log != nil {
			d.log.Close()
		}
		if d.lock != nil {
			d.lock.Close()
		}
	})
	return d.err
}

// clean removes everything of the daemon d.id, whose dockerd is not
// running any more or is to be killed.
func (d *Daemon) clean() error {
	var errs []error
	if err := hostclean.KillAll("daemon "+d.id, d.pids); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, hostclean.UnmountUnder(d.dir))
	errs = append(errs, d.removeShimSockets())
	if _, err := os.Stat("/run/netns/" + d.Netns()); err == nil {
		if out, err := exec.Command("ip", "netns", "delete", d.Netns()).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %v: %s", d.Netns(), err, out))
		}
	}
	errs = append(errs, hostclean.RemoveCgroupTree(d.Cgroup()))
	if err := errors.Join(errs...); err != nil {
		return err // keep the directory: the next Start tries again
	}
	return os.RemoveAll(d.dir)
}

// pids lists the processes of the daemon: in its network namespace (the
// daemon, containerd, shims) or in its cgroup (those and the containers).
func (d *Daemon) pids() []int {
	seen := map[int]bool{}
	if ns, err := os.Stat("/run/netns/" + d.Netns()); err == nil {
		want := ns.Sys().(*syscall.Stat_t)
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			fi, err := os.Stat("/proc/" + e.Name() + "/ns/net")
			if err != nil {
				continue
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Ino == want.Ino && st.Dev == want.Dev {
				seen[pid] = true
			}
		}
	}
	for _, pid := range hostclean.CgroupPids(d.Cgroup()) {
		seen[pid] = true
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// daemonCgroup makes the cgroup that dockerd starts in and returns its
// cgroup.procs: with cgroup v1 under the pids hierarchy, with v2 the
// unified one.
func (d *Daemon) daemonCgroup() (string, error) {
	root := "/sys/fs/cgroup/pids"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		root = "/sys/fs/cgroup"
	}
	dir := filepath.Join(root, d.Cgroup(), "daemon")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	return filepath.Join(dir, "cgroup.procs"), nil
}

// removeShimSockets removes the sockets that the daemon's containerd
// shims left. containerd 1.6 names a shim's socket
// /run/containerd/s/sha256(containerd's socket + "/moby/" + container id),
// whatever its own state directory is; a shim killed with -9 leaves it.
func (d *Daemon) removeShimSockets() error {
	ids := map[string]bool{}
	for _, dir := range []string{
		filepath.Join(d.DataRoot(), "containers"),
		filepath.Join(d.ExecRoot(), "containerd", "daemon", "io.containerd.runtime.v2.task", "moby"),
	} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			ids[e.Name()] = true
		}
	}
	var errs []error
	for id := range ids {
		sum := sha256.Sum256([]byte(filepath.Join(d.ExecRoot(), "containerd", "containerd.sock", "moby", id)))
		p := filepath.Join(ShimSocketDir, hex.EncodeToString(sum[:]))
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ShimSocketDir is where containerd 1.6 puts every shim's socket.
const ShimSocketDir = "/run/containerd/s"

// ShimSockets returns the shim sockets of the daemon's containers that
// exist now.
func (d *Daemon) ShimSockets() []string {
	var out []string
	for _, dir := range []string{filepath.Join(d.DataRoot(), "containers")} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			sum := sha256.Sum256([]byte(filepath.Join(d.ExecRoot(), "containerd", "containerd.sock", "moby", e.Name())))
			p := filepath.Join(ShimSocketDir, hex.EncodeToString(sum[:]))
			if _, err := os.Stat(p); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// busyboxImage builds the test image as a docker-archive tarball from
// the host's static busybox.
func busyboxImage() ([]byte, error) {
	const bbPath = "/bin/busybox"
	if err := checkStatic(bbPath); err != nil {
		return nil, fmt.Errorf("%s: %w (install Debian's busybox-static)", bbPath, err)
	}
	bb, err := os.ReadFile(bbPath)
	if err != nil {
		return nil, err
	}
	list, err := exec.Command(bbPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	epoch := time.Unix(0, 0)
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	add := func(h *tar.Header, body []byte) error {
		h.ModTime, h.Format = epoch, tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	dirs := []struct {
		name string
		mode int64
	}{{"bin", 0o755}, {"dev", 0o755}, {"etc", 0o755}, {"home", 0o755}, {"proc", 0o555}, {"root", 0o700},
		{"sys", 0o555}, {"tmp", 0o1777}, {"usr", 0o755}, {"usr/bin", 0o755}, {"var", 0o755}, {"var/tmp", 0o1777}}
	for _, dir := range dirs {
		if err := add(&tar.Header{Typeflag: tar.TypeDir, Name: dir.name + "/", Mode: dir.mode}, nil); err != nil {
			return nil, err
		}
	}
	files := []struct {
		name string
		mode int64
		body []byte
	}{
		{"bin/busybox", 0o755, bb},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, f := range files {
		if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.body))}, f.body); err != nil {
			return nil, err
		}
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := add(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777}, nil); err != nil {
			return nil, err
		}
	}
	if err := add(&tar.Header{Typeflag: tar.TypeSymlink, Name: "usr/bin/env", Linkname: "../../bin/busybox", Mode: 0o777}, nil); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerSum := sha256.Sum256(layer.Bytes())
	layerHex := hex.EncodeToString(layerSum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"Cmd": []string{"sh"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerHex}},
	})
	if err != nil {
		return nil, err
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config": configName, "RepoTags": []string{Image}, "Layers": []string{layerHex + "/layer.tar"},
	}})
	if err != nil {
		return nil, err
	}
	var archive bytes.Buffer
	aw := tar.NewWriter(&archive)
	for _, f := range []struct {
		name string
		body []byte
	}{{layerHex + "/layer.tar", layer.Bytes()}, {configName, config}, {"manifest.json", manifest}} {
		if err := aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.body)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := aw.Write(f.body); err != nil {
			return nil, err
		}
	}
	if err := aw.Close(); err != nil {
		return nil, err
	}
	return archive.Bytes(), nil
}

// checkStatic refuses a dynamically linked binary: the image has no
// libraries.
func checkStatic(name string) error {
	f, err := elf.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked")
		}
	}
	return nil
}

// Leftovers lists what remains of the daemon on the host: processes,
// its network namespace, cgroups, mounts, shim sockets, its directory.
// After Stop it is empty.
func (d *Daemon) Leftovers() []string {
	var out []string
	for _, pid := range d.pids() {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		out = append(out, fmt.Sprintf("process %d (%s)", pid, strings.TrimSpace(string(cmd))))
	}
	if _, err := os.Stat("/run/netns/" + d.Netns()); err == nil {
		out = append(out, "network namespace "+d.Netns())
	}
	for _, c := range hostclean.Cgroups(d.Cgroup()) {
		out = append(out, "cgroup "+c)
	}
	for _, p := range hostclean.MountsUnder(d.dir) {
		out = append(out, "mount "+p)
	}
	for _, s := range d.ShimSockets() {
		out = append(out, "shim socket "+s)
	}
	if _, err := os.Stat(d.dir); err == nil {
		out = append(out, "directory "+d.dir)
	}
	return out
}

// Find returns the daemon whose directory is dir, to inspect or clean
// up after a test process that died.
func Find(dir string) *Daemon {
	return &Daemon{id: filepath.Base(dir), dir: dir}
}
