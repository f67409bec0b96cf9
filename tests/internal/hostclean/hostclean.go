// Package hostclean finds and removes what test harnesses leave on the
// host: the processes, cgroups and mounts of throwaway instances (a
// systemd-nspawn machine, a private dockerd) whose test process died.
//
// An instance has a directory Base/ID, held by a lock while its test
// process lives, and a cgroup of its own name at the root of the host's
// hierarchies. The lock goes with the process, so an instance whose lock
// is free is dead, and the next test process removes it by its names
// only. Making and cleaning up instances happens under a lock on Base, so
// that no two test processes race.
package hostclean

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LockBase takes the lock on base that making and cleaning up instances
// hold, waiting for it; closing the file releases it. It makes base when
// there is none.
func LockBase(base string) (*os.File, error) {
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(base, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", base, err)
	}
	return f, nil
}

// LockDir takes the lock of an instance directory, dir/lock, without
// waiting; it returns nil when another process holds it. The lock goes
// with the process: a test killed with -9 leaves its instance's lock
// free, which is how CleanDead knows the instance is dead.
func LockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, err
	}
	return f, nil
}

// CleanDead calls clean for every instance of base, known by its
// directory or named in extra, whose directory lock no live process
// holds; an instance in extra without a directory is cleaned too. The
// caller holds LockBase(base).
func CleanDead(base string, extra []string, clean func(id string) error) error {
	entries, err := os.ReadDir(base)
	if err != nil {
		return err
	}
	ids := slices.Clone(extra)
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids)
	var errs []error
	for _, id := range slices.Compact(ids) {
		lock, err := LockDir(filepath.Join(base, id))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // no directory: only what else it had is left
		} else if err != nil {
			errs = append(errs, err)
			continue
		} else if lock == nil {
			continue // a live test process holds it
		}
		errs = append(errs, clean(id))
		if lock != nil {
			lock.Close()
		}
	}
	return errors.Join(errs...)
}

// Start starts cmd with SIGTERM as its parent-death signal, so that it
// stops when the test process dies, and closes exited once it has exited
// (at once when it does not start). The signal follows the thread that
// started the process, not the process: the thread stays locked to a
// goroutine that waits for cmd and ends with it.
func Start(cmd *exec.Cmd, exited chan<- struct{}) (pid int, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		pid = cmd.Process.Pid
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		close(exited)
		return 0, err
	}
	return pid, nil
}

// Stop stops what Start started: SIGTERM, then SIGKILL when it has not
// exited after grace. It waits until it has exited, and does nothing when
// pid is 0 (nothing was started).
func Stop(pid int, exited <-chan struct{}, grace time.Duration) {
	if pid == 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-exited
	}
}

// KillAll kills the processes that pids lists with SIGKILL until it lists
// none: an instance's processes may fork while they are killed. what
// names the instance in the error when some survive 30 seconds.
func KillAll(what string, pids func() []int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := pids()
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes of %s survive SIGKILL: %v", what, left)
		}
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// CgroupMount is one mounted cgroup hierarchy.
type CgroupMount struct {
	// Point is where it is mounted.
	Point string
	// FSType is "cgroup" (v1) or "cgroup2".
	FSType string
	// Options are its super options, such as "rw,name=systemd".
	Options string
}

// CgroupMounts lists the host's cgroup hierarchies, from this process's
// /proc/self/mountinfo; none when it cannot be read.
func CgroupMounts() []CgroupMount {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	return parseCgroupMounts(string(b))
}

func parseCgroupMounts(mountinfo string) []CgroupMount {
	var out []CgroupMount
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		c := CgroupMount{Point: unescapeMount(f[4]), FSType: g[0]}
		if len(g) >= 3 {
			c.Options = g[2]
		}
		out = append(out, c)
	}
	return out
}

// CgroupRoots are the mount points of the host's cgroup hierarchies: an
// instance's cgroup may be in any of them.
func CgroupRoots() []string {
	var roots []string
	for _, c := range CgroupMounts() {
		roots = append(roots, c.Point)
	}
	return roots
}

// Cgroups lists the cgroups named name at the root of the host's
// hierarchies that exist now.
func Cgroups(name string) []string {
	var out []string
	for _, root := range CgroupRoots() {
		p := filepath.Join(root, name)
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// CgroupPids lists, sorted, the processes in the cgroup trees named name
// at the root of every hierarchy: an instance's processes, also those
// that left its other namespaces.
func CgroupPids(name string) []int {
	var pids []int
	for _, root := range CgroupRoots() {
		_ = filepath.WalkDir(filepath.Join(root, name), func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	slices.Sort(pids)
	return slices.Compact(pids)
}

// RemoveCgroupTree removes the cgroup trees named name at the root of
// every hierarchy, deepest first, once their processes are gone. It
// retries for a while: a cgroup stays busy for a moment after its last
// process died.
func RemoveCgroupTree(name string) error {
	var errs []error
	for _, root := range CgroupRoots() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(root, name), func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, dir := range slices.Backward(dirs) {
			if err := rmdirRetry(dir); err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
			}
		}
	}
	return errors.Join(errs...)
}

func rmdirRetry(dir string) error {
	var err error
	for range 50 {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// UnmountUnder unmounts every mount of this process's mount namespace at
// or below dir, deepest first, so that removing dir removes nothing of a
// mounted file system. Instances mount in namespaces of their own, so
// there are none unless something went wrong.
func UnmountUnder(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range mountsUnder(string(b), dir) {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// MountsUnder lists the mount points of this process's mount namespace
// at or below dir, deepest first; none when /proc/self/mountinfo cannot
// be read.
func MountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	return mountsUnder(string(b), dir)
}

func mountsUnder(mountinfo, dir string) []string {
	var points []string
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMount(f[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	// In reverse order a mount point comes before every mount point that
	// it is a prefix of, so what is below it is unmounted first.
	slices.Sort(points)
	slices.Reverse(points)
	return points
}

// unescapeMount undoes the octal escapes of a path in mountinfo.
func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}
