// Package systemdtest boots throwaway systemd machines for integration
// tests that run a service unit under a real systemd.
//
// A machine is systemd-nspawn booting the host's own /usr on an empty
// tmpfs root (--volatile=yes): nothing is installed, nothing of the host
// is written. It shares the host's network, so a unit inside reaches
// servers on the host's 127.0.0.1 (a test PDS, a Kubernetes API server).
// Unit files come from a host directory bound at /etc/systemd/system,
// binaries and fixtures from one bound at /opt/knotless-test.
//
//	m := systemdtest.Boot(t, systemdtest.Options{
//		Units: map[string]string{"knotless-run.service": unit},
//		Files: map[string][]byte{"knotless-run": binary},
//	})
//	m.Systemctl(ctx, "start", "knotless-run.service")
//	m.WaitState(ctx, "knotless-run.service", "active")
//
// Besides systemd's own (journald, dbus, logind), only the units a test
// starts run: the volatile /etc enables nothing, and a preset disables
// everything a first boot would enable (docker, containerd, postgresql
// are installed on the test machines).
//
// Each machine has a directory Base/ID, held by a lock while its test
// process lives, and the cgroup /knotless-nspawn-ID in the name=systemd
// and unified hierarchies. Its mounts live in private mount namespaces
// and go with its processes. What a killed test process left (processes,
// cgroups, the directory) is removed by the next Boot, by these names only.
//
// Cgroup limits (MemoryMax=, CPUQuota=, TasksMax=) and IPAddressDeny= are
// accepted inside but not enforced: the test hosts are cgroup v1 (hybrid)
// and the machine gets no controllers of its own. Do not assert them here.
package systemdtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"knotless.dev/run/tests/internal/hostclean"
)

// Base holds one directory per machine, named by its id.
const Base = "/tmp/knotless-nspawn"

// OptPath is where OptDir appears inside the machine.
const OptPath = "/opt/knotless-test"

// prefix names a machine and its cgroup.
const prefix = "knotless-nspawn-"

// Generous, for machines that share the host with a Kubernetes cluster.
const (
	bootTimeout = 60 * time.Second
	stopTimeout = 60 * time.Second
)

// NetworkPrefix holds the addresses of PrivateNetwork machines, one /32
// each.
const NetworkPrefix = "10.223.252.0/24"

// path is the PATH of the machine's systemd-nspawn and of Exec.
const path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options says what a machine has at boot.
type Options struct {
	// Units are unit files (and drop-ins, "name.service.d/x.conf") by
	// path under /etc/systemd/system. None is started or enabled.
	Units map[string]string
	// Files are written under OptDir, which is OptPath inside, with mode
	// 0755 (binaries and scripts run; everything is readable).
	Files map[string][]byte
	// Binds are extra systemd-nspawn --bind= arguments,
	// "HOST[:GUEST[:OPTIONS]]", read-write.
	Binds []string
	// BindsRO are systemd-nspawn --bind-ro= arguments, "HOST[:GUEST]".
	BindsRO []string
	// PrivateNetwork gives the machine a network namespace of its own
	// instead of the host's: a veth pair (systemd-nspawn
	// --network-veth-extra), the host's end kn<ID>, the machine's host0
	// with an address of its own in NetworkPrefix (a /32; the host routes
	// it to the link) and a default route onto the link. The host answers
	// ARP only for its own addresses, so the machine reaches the host's
	// addresses (an API server on one) and nothing beyond, and its ports
	// are its own. The pair and the route go with the machine's
	// namespace, also when the machine is killed.
	PrivateNetwork bool
	// Env is KEY=VALUE set for every unit (DefaultEnvironment=).
	Env []string
}

// Machine is one booted throwaway systemd.
type Machine struct {
	id     string
	dir    string
	lock   *os.File
	pid    int // systemd-nspawn, on the host
	leader int // the machine's PID 1, on the host
	exited chan struct{}
	log    *os.File
	addr   string // the machine's address with PrivateNetwork
	closed atomic.Bool
	close  sync.Once
	err    error
}

// Name is the machine's name and hostname, knotless-nspawn-ID.
func (m *Machine) Name() string { return prefix + m.id }

// Dir is the machine's directory on the host.
func (m *Machine) Dir() string { return m.dir }

// UnitsDir is the host directory that is /etc/systemd/system inside: add
// a unit file there, then run `systemctl daemon-reload`.
func (m *Machine) UnitsDir() string { return filepath.Join(m.dir, "units") }

// OptDir is the host directory that is OptPath inside.
func (m *Machine) OptDir() string { return filepath.Join(m.dir, "opt") }

// Address is the machine's address with Options.PrivateNetwork, else "".
func (m *Machine) Address() string { return m.addr }

// Leader is the host PID of the machine's PID 1 (systemd).
func (m *Machine) Leader() int { return m.leader }

// Boot boots a machine for t and tears it down when t ends; if t failed,
// it logs the machine's journal first. It skips t under -short and when
// not root.
func Boot(t testing.TB, opts Options) *Machine {
	t.Helper()
	skip(t)
	m, failed, err := boot(context.Background(), opts)
	if err != nil {
		t.Fatalf("boot systemd machine: %v", err)
	}
	if failed != "" {
		t.Logf("systemd machine %s is degraded; failed units:\n%s", m.Name(), failed)
	}
	t.Cleanup(func() {
		if t.Failed() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			out, err := m.Exec(ctx, "journalctl", "--no-pager", "-n", "200")
			cancel()
			if err != nil {
				t.Logf("journal of machine %s: %v", m.Name(), err)
			} else {
				t.Logf("journal of machine %s (last 200 lines):\n%s", m.Name(), out)
			}
		}
		if err := m.Close(); err != nil {
			t.Errorf("tear down systemd machine: %v", err)
		}
	})
	return m
}

// skip skips t under -short and when not root, saying why.
func skip(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: this test boots a throwaway systemd with systemd-nspawn (root); run without -short to run it")
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: this test boots a throwaway systemd with systemd-nspawn and needs root")
	}
}

// boot makes and boots a machine. It returns the failed units when the
// machine came up degraded.
func boot(ctx context.Context, opts Options) (*Machine, string, error) {
	for _, bin := range []struct{ name, pkg string }{
		{"systemd-nspawn", "systemd-container"}, {"unshare", "util-linux"},
		{"nsenter", "util-linux"}, {"mount", "mount"},
	} {
		if _, err := exec.LookPath(bin.name); err != nil {
			return nil, "", fmt.Errorf("%s not found: install Debian's %s (run tests/systemd/install as root)", bin.name, bin.pkg)
		}
	}
	m, err := create()
	if err != nil {
		return nil, "", err
	}
	if err := m.write(opts); err != nil {
		return nil, "", errors.Join(err, m.Close())
	}
	failed, err := m.start(ctx, opts)
	if err != nil {
		return nil, "", errors.Join(err, m.Close())
	}
	if opts.PrivateNetwork {
		if err := m.network(ctx); err != nil {
			return nil, "", errors.Join(err, m.Close())
		}
	}
	return m, failed, nil
}

// create cleans up after dead machines and makes a new machine's
// directory and lock, under a lock on Base so that no two test processes
// race.
func create() (*Machine, error) {
	global, err := lockBase()
	if err != nil {
		return nil, err
	}
	defer global.Close()
	if err := cleanDead(); err != nil {
		return nil, fmt.Errorf("clean up after earlier machines: %w", err)
	}
	m := &Machine{id: randomHex(4), exited: make(chan struct{})}
	m.dir = filepath.Join(Base, m.id)
	if err := os.Mkdir(m.dir, 0o700); err != nil {
		return nil, fmt.Errorf("create machine directory: %w", err)
	}
	if m.lock, err = hostclean.LockDir(m.dir); err != nil || m.lock == nil {
		return nil, errors.Join(fmt.Errorf("lock new machine directory %s: %v", m.dir, err), os.RemoveAll(m.dir))
	}
	return m, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// write writes what the machine's binds show inside.
func (m *Machine) write(opts Options) error {
	for _, d := range []string{m.UnitsDir(), m.OptDir(), m.presetDir(), m.confDir()} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("create machine directory: %w", err)
		}
	}
	// An id of its own, bound read-only: with none, systemd would see a
	// first boot, enable units by preset and try to commit the id.
	if err := os.WriteFile(m.machineIDFile(), []byte(randomHex(16)+"\n"), 0o444); err != nil {
		return fmt.Errorf("write machine id: %w", err)
	}
	// Should systemd still see a first boot, it enables by preset: none.
	if err := os.WriteFile(filepath.Join(m.presetDir(), "00-knotless-test.preset"), []byte("disable *\n"), 0o644); err != nil {
		return fmt.Errorf("write preset: %w", err)
	}
	conf := "[Manager]\n"
	if len(opts.Env) > 0 {
		var quoted []string
		for _, kv := range opts.Env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				return fmt.Errorf("environment %q is not KEY=VALUE", kv)
			}
			quoted = append(quoted, strconv.Quote(kv))
		}
		conf += "DefaultEnvironment=" + strings.Join(quoted, " ") + "\n"
	}
	if err := os.WriteFile(filepath.Join(m.confDir(), "knotless-test.conf"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("write system.conf drop-in: %w", err)
	}
	for name, body := range opts.Units {
		if err := writeUnder(m.UnitsDir(), name, []byte(body), 0o644); err != nil {
			return fmt.Errorf("write unit: %w", err)
		}
	}
	for name, body := range opts.Files {
		if err := writeUnder(m.OptDir(), name, body, 0o755); err != nil {
			return fmt.Errorf("write file: %w", err)
		}
	}
	return nil
}

func writeUnder(dir, name string, body []byte, mode os.FileMode) error {
	if !filepath.IsLocal(name) {
		return fmt.Errorf("%q is not a relative path inside the directory", name)
	}
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p, body, mode); err != nil {
		return err
	}
	return os.Chmod(p, mode) // whatever the umask
}

func (m *Machine) presetDir() string     { return filepath.Join(m.dir, "preset") }
func (m *Machine) confDir() string       { return filepath.Join(m.dir, "system.conf.d") }
func (m *Machine) machineIDFile() string { return filepath.Join(m.dir, "machine-id") }
func (m *Machine) logFile() string       { return filepath.Join(m.dir, "nspawn.log") }

// start runs systemd-nspawn in the machine's cgroup and waits until the
// machine's systemd has booted.
func (m *Machine) start(ctx context.Context, opts Options) (string, error) {
	procs, err := m.makeCgroups()
	if err != nil {
		return "", err
	}
	log, err := os.Create(m.logFile())
	if err != nil {
		return "", err
	}
	m.log = log
	// The shell moves itself into the machine's cgroups (else nspawn puts
	// payload/ and supervisor/ at the cgroup root, shared by all
	// machines), then becomes unshare and that nspawn. The tmpfs on
	// /run/systemd, private to nspawn's mount namespace, takes nspawn's
	// run state (else it refuses to clean up its volatile root there).
	args := []string{"-c", `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ >"$1" || exit 1; shift; n=$((n-1)); done; exec "$@"`,
		"sh", strconv.Itoa(len(procs))}
	args = append(args, procs...)
	args = append(args,
		"unshare", "--mount", "--propagation", "private",
		"sh", "-c", `mount -t tmpfs -o mode=0755 knotless-nspawn /run/systemd && exec "$@"`, "sh",
		"systemd-nspawn",
		"--quiet",
		"--register=no",
		"--keep-unit",
		"--volatile=yes",
		"--directory=/",
		"--machine="+m.Name(),
		"--bind-ro="+m.machineIDFile()+":/etc/machine-id",
		"--bind="+m.UnitsDir()+":/etc/systemd/system",
		"--bind-ro="+m.presetDir()+":/etc/systemd/system-preset",
		"--bind-ro="+m.confDir()+":/etc/systemd/system.conf.d",
		"--bind="+m.OptDir()+":"+OptPath,
	)
	for _, b := range opts.Binds {
		args = append(args, "--bind="+b)
	}
	for _, b := range opts.BindsRO {
		args = append(args, "--bind-ro="+b)
	}
	if opts.PrivateNetwork {
		args = append(args, "--network-veth-extra="+m.hostLink()+":host0")
	}
	args = append(args, "--boot", "--",
		// The machine id is fixed and read-only: nothing to commit.
		"systemd.mask=systemd-machine-id-commit.service",
		// Nobody logs in on the console, which is nspawn's log.
		"systemd.mask=console-getty.service",
	)
	cmd := exec.Command("sh", args...)
	// SYSTEMD_NSPAWN_LOCK=0: machines share the read-only tree "/".
	cmd.Env = []string{path, "TERM=dumb", "SYSTEMD_NSPAWN_LOCK=0"}
	cmd.Stdout, cmd.Stderr = log, log
	if m.pid, err = hostclean.Start(cmd, m.exited); err != nil {
		return "", fmt.Errorf("start systemd-nspawn: %w", err)
	}

	if err := m.waitLeader(ctx); err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	out, err := m.Systemctl(wctx, "is-system-running", "--wait")
	state := strings.TrimSpace(string(out))
	switch {
	case state == "running":
		return "", nil
	case state == "degraded":
		failed, err := m.Systemctl(ctx, "list-units", "--state=failed", "--no-legend", "--plain")
		if err != nil {
			return "", fmt.Errorf("list failed units: %w", err)
		}
		return string(failed), nil
	default:
		return "", fmt.Errorf("systemd did not come up (is-system-running: %q): %v\n%s", state, err, m.logTail())
	}
}

// hostLink is the host's end of a PrivateNetwork machine's veth pair.
func (m *Machine) hostLink() string { return "kn" + m.id }

// network gives a PrivateNetwork machine its address: the first of
// NetworkPrefix that no other machine routes (adding the route is the
// claim, so two machines never take the same), the link up at both ends
// and the machine's default route onto it.
func (m *Machine) network(ctx context.Context) error {
	link := m.hostLink()
	if out, err := exec.CommandContext(ctx, "ip", "link", "set", link, "up").CombinedOutput(); err != nil {
		return fmt.Errorf("bring up %s: %w: %s", link, err, out)
	}
	base, _, _ := strings.Cut(NetworkPrefix, "/")
	prefix := base[:strings.LastIndexByte(base, '.')+1]
	for n := 2; n < 255; n++ {
		addr := prefix + strconv.Itoa(n)
		out, err := exec.CommandContext(ctx, "ip", "route", "add", addr+"/32", "dev", link).CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "File exists") {
				continue
			}
			return fmt.Errorf("route %s to %s: %w: %s", addr, link, err, out)
		}
		m.addr = addr
		_, err = m.Exec(ctx, "sh", "-c", `ip addr add "$1/32" dev host0 && ip link set host0 up && ip route add default dev host0`, "sh", addr)
		return err
	}
	return fmt.Errorf("no free address in %s for machine %s", NetworkPrefix, m.Name())
}

// waitLeader finds the machine's PID 1 and waits for its private bus
// socket, which systemctl inside needs.
func (m *Machine) waitLeader(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	for {
		if m.leader == 0 {
			m.leader = leaderOf(m.pid)
		}
		if m.leader != 0 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d/root/run/systemd/private", m.leader)); err == nil {
				return nil
			}
		}
		select {
		case <-m.exited:
			return fmt.Errorf("systemd-nspawn exited at boot:\n%s", m.logTail())
		case <-ctx.Done():
			return fmt.Errorf("systemd of machine %s (PID %d) did not start within %s:\n%s", m.Name(), m.leader, bootTimeout, m.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// leaderOf returns the child of nspawn that is PID 1 of a new PID
// namespace, or 0 while there is none. (nspawn's other, short-lived
// child sets up the mounts in nspawn's own PID namespace.)
func leaderOf(nspawn int) int {
	own, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", nspawn))
	if err != nil {
		return 0
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", nspawn))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(s)
			if err != nil {
				continue
			}
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && ns != own {
				return pid
			}
		}
	}
	return 0
}

func (m *Machine) logTail() string {
	b, _ := os.ReadFile(m.logFile())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Exec runs a command in all the machine's namespaces, as root with a
// plain PATH, and returns its combined output. Its error holds the
// output.
func (m *Machine) Exec(ctx context.Context, args ...string) ([]byte, error) {
	cmd, err := m.command(ctx, args)
	if err != nil {
		return nil, err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("in machine %s: %s: %w\n%s", m.Name(), strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Command is the command Exec runs, for a caller that needs its stdin
// or streams.
func (m *Machine) Command(ctx context.Context, args ...string) (*exec.Cmd, error) {
	return m.command(ctx, args)
}

func (m *Machine) command(ctx context.Context, args []string) (*exec.Cmd, error) {
	if m.leader == 0 || m.closed.Load() {
		return nil, fmt.Errorf("machine %s is not running", m.Name())
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(m.leader), "-a", "--"}, args...)...)
	cmd.Env = []string{path, "TERM=dumb", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"}
	return cmd, nil
}

// Systemctl runs systemctl in the machine.
func (m *Machine) Systemctl(ctx context.Context, args ...string) ([]byte, error) {
	return m.Exec(ctx, append([]string{"systemctl", "--no-pager"}, args...)...)
}

// Show returns one property of a unit (systemctl show -p PROP --value).
func (m *Machine) Show(ctx context.Context, unit, prop string) (string, error) {
	out, err := m.Systemctl(ctx, "show", "-p", prop, "--value", "--", unit)
	return strings.TrimSpace(string(out)), err
}

// WaitState waits until the unit's ActiveState is state ("active",
// "inactive", "failed", ...). It gives up early, with the unit's status,
// when the unit failed and state is not "failed".
func (m *Machine) WaitState(ctx context.Context, unit, state string) error {
	var last string
	for {
		got, err := m.Show(ctx, unit, "ActiveState")
		if err == nil {
			last = got
			if got == state {
				return nil
			}
		}
		if got == "failed" || ctx.Err() != nil {
			st, _ := m.Systemctl(context.WithoutCancel(ctx), "status", "--", unit)
			return fmt.Errorf("unit %s is %q, waited for %q: %v\n%s", unit, last, state, errors.Join(err, ctx.Err()), st)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// JournalEntry is one journal record: field name to value. Binary
// values are their bytes; of a field given more than once, the last.
type JournalEntry map[string]string

// Journal returns the journal of a unit (journalctl -u UNIT -o json), or
// of the whole machine when unit is "".
func (m *Machine) Journal(ctx context.Context, unit string) ([]JournalEntry, error) {
	args := []string{"journalctl", "--no-pager", "-o", "json"}
	if unit != "" {
		args = append(args, "-u", unit)
	}
	cmd, err := m.command(ctx, args)
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("in machine %s: %s: %w\n%s", m.Name(), strings.Join(args, " "), err, stderr.Bytes())
	}
	var entries []JournalEntry
	for _, line := range bytes.Split(out, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		e, err := parseJournalEntry(line)
		if err != nil {
			return nil, fmt.Errorf("parse journal entry %q: %w", line, err)
		}
		entries = append(entries, e)
	}
	return entries, nil
}

func parseJournalEntry(line []byte) (JournalEntry, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return nil, err
	}
	e := JournalEntry{}
	for k, v := range raw {
		s, err := journalValue(v)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", k, err)
		}
		e[k] = s
	}
	return e, nil
}

// journalValue decodes a value of journalctl's JSON: a string, null (too
// large), an array of bytes (binary), or an array of those (a field given
// more than once).
func journalValue(v json.RawMessage) (string, error) {
	var s *string
	if err := json.Unmarshal(v, &s); err == nil {
		if s == nil {
			return "", nil
		}
		return *s, nil
	}
	var b []byte
	var nums []int
	if err := json.Unmarshal(v, &nums); err == nil {
		for _, n := range nums {
			b = append(b, byte(n))
		}
		return string(b), nil
	}
	var many []json.RawMessage
	if err := json.Unmarshal(v, &many); err != nil || len(many) == 0 {
		return "", fmt.Errorf("unexpected value %s", v)
	}
	return journalValue(many[len(many)-1])
}

// Close halts the machine (SIGTERM to nspawn, SIGKILL after a minute) and
// removes everything of it: processes, cgroups, the directory. It is safe
// to call more than once.
func (m *Machine) Close() error {
	m.close.Do(func() {
		m.closed.Store(true)
		hostclean.Stop(m.pid, m.exited, stopTimeout)
		m.err = m.clean()
		if m.log != nil {
			m.log.Close()
		}
		if m.lock != nil {
			m.lock.Close()
		}
	})
	return m.err
}

// Clean removes what the machines of dead test processes left. Machines
// of live test processes are left alone.
func Clean() error {
	global, err := lockBase()
	if err != nil {
		return err
	}
	defer global.Close()
	return cleanDead()
}

// lockBase takes the lock on Base that making and cleaning up machines
// hold; closing the file releases it.
func lockBase() (*os.File, error) { return hostclean.LockBase(Base) }

// cleanDead cleans every machine, known by its directory or only by its
// cgroup, whose directory lock no live process holds.
func cleanDead() error {
	var ids []string
	for _, root := range hostclean.CgroupRoots() {
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if id, ok := strings.CutPrefix(e.Name(), prefix); ok && e.IsDir() && id != "" && filepath.IsLocal(id) {
				ids = append(ids, id)
			}
		}
	}
	return hostclean.CleanDead(Base, ids, func(id string) error {
		m := &Machine{id: id, dir: filepath.Join(Base, id)}
		return m.clean()
	})
}

// clean removes everything of the machine m.id, whose nspawn is not
// running any more or is to be killed.
func (m *Machine) clean() error {
	var errs []error
	if err := hostclean.KillAll("machine "+m.Name(), m.pids); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, hostclean.UnmountUnder(m.dir))
	errs = append(errs, hostclean.RemoveCgroupTree(m.Name()))
	if err := errors.Join(errs...); err != nil {
		return err // keep the directory: the next Boot tries again
	}
	if err := os.RemoveAll(m.dir); err != nil {
		return fmt.Errorf("remove machine directory: %w", err)
	}
	return nil
}

// pids lists the processes in the machine's cgroups: nspawn, the
// machine's systemd and its services.
func (m *Machine) pids() []int { return hostclean.CgroupPids(m.Name()) }

// makeCgroups makes the machine's cgroup in the hierarchies where nspawn
// places itself and its payload, and returns their cgroup.procs.
func (m *Machine) makeCgroups() ([]string, error) {
	roots := trackingRoots()
	if len(roots) == 0 {
		return nil, errors.New("no name=systemd or cgroup2 hierarchy is mounted")
	}
	var procs []string
	for _, root := range roots {
		dir := filepath.Join(root, m.Name())
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		procs = append(procs, filepath.Join(dir, "cgroup.procs"))
	}
	return procs, nil
}

// cgroupRoots are the mount points of the host's cgroup hierarchies.
func cgroupRoots() []string { return hostclean.CgroupRoots() }

// trackingRoots are the hierarchies that systemd tracks processes in:
// the cgroup2 one (unified or hybrid) and, with cgroup v1, name=systemd.
func trackingRoots() []string {
	var roots []string
	for _, c := range hostclean.CgroupMounts() {
		if c.FSType == "cgroup2" || strings.Contains(","+c.Options+",", ",name=systemd,") {
			roots = append(roots, c.Point)
		}
	}
	return roots
}

// zombie says whether pid has exited and waits to be reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may
	// itself hold parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && len(b) > i+2 && b[i+2] == 'Z'
}

func ownPidNS() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
}

// Leftovers lists what remains of the machine on the host: processes,
// cgroups, mounts, its directory. After Close it is empty.
func (m *Machine) Leftovers() []string {
	var out []string
	for _, pid := range m.pids() {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		out = append(out, fmt.Sprintf("process %d (%s)", pid, strings.TrimSpace(string(comm))))
	}
	// nspawn and the commands that start it name the machine.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte("--machine="+m.Name()+"\x00")) {
			out = append(out, fmt.Sprintf("process %s (%s)", filepath.Base(filepath.Dir(p)), bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	// A killed PID 1 whose nspawn died too waits, a zombie, for the host's
	// init to reap it: it holds nothing but its PID.
	if m.leader != 0 && !zombie(m.leader) {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", m.leader)); err == nil && ns != ownPidNS() {
			out = append(out, fmt.Sprintf("process %d (the machine's PID 1)", m.leader))
		}
	}
	for _, c := range hostclean.Cgroups(m.Name()) {
		out = append(out, "cgroup "+c)
	}
	for _, p := range hostclean.MountsUnder(m.dir) {
		out = append(out, "mount "+p)
	}
	if _, err := os.Stat(m.dir); err == nil {
		out = append(out, "directory "+m.dir)
	}
	return out
}
