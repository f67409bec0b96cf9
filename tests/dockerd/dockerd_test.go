package dockerd

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// hostNetState is what a daemon must not change in the host's network
// namespace.
func hostNetState(t *testing.T) string {
	t.Helper()
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("iptables", "-w", "-S").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -S: %v: %s", err, out)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "-P FORWARD") || strings.Contains(l, "DOCKER") {
			lines = append(lines, l)
		}
	}
	links, err := exec.Command("ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link: %v: %s", err, links)
	}
	var bridges []string
	for _, l := range strings.Split(string(links), "\n") {
		if strings.Contains(l, ": br-") || strings.Contains(l, ": docker0") {
			bridges = append(bridges, l)
		}
	}
	return fmt.Sprintf("ip_forward=%s\n%s\n%s", strings.TrimSpace(string(fwd)), strings.Join(lines, "\n"), strings.Join(bridges, "\n"))
}

// runContainer starts a container of the test image on a network of its
// own and returns the shim sockets that exist then.
func runContainer(t *testing.T, d *Daemon) []string {
	t.Helper()
	ctx := context.Background()
	cli, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	nw, err := cli.NetworkCreate(ctx, "harness-test", client.NetworkCreateOptions{Driver: "bridge"})
	if err != nil {
		t.Fatalf("network create: %v", err)
	}
	yes := true
	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config:     &container.Config{Image: d.Image(), Cmd: []string{"sh", "-c", "sleep 3600 & sleep 3600"}},
		HostConfig: &container.HostConfig{Init: &yes, NetworkMode: container.NetworkMode(nw.ID)},
	})
	if err != nil {
		t.Fatalf("container create: %v", err)
	}
	if _, err := cli.ContainerStart(ctx, c.ID, client.ContainerStartOptions{}); err != nil {
		t.Fatalf("container start: %v\n%s", err, d.logTail())
	}
	socks := d.ShimSockets()
	if len(socks) != 1 {
		t.Fatalf("shim sockets of a running container: %v", socks)
	}
	return socks
}

func checkGone(t *testing.T, d *Daemon, socks []string, before string) {
	t.Helper()
	if left := d.Leftovers(); len(left) > 0 {
		t.Errorf("left after teardown:\n%s", strings.Join(left, "\n"))
	}
	for _, s := range socks {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("shim socket %s is still there", s)
		}
	}
	if after := hostNetState(t); after != before {
		t.Errorf("host network state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestStartStop(t *testing.T) {
	skipShort(t)
	before := hostNetState(t)
	d, err := New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	cli, err := d.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	v, err := cli.ServerVersion(context.Background(), client.ServerVersionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("private dockerd %s, API %s, at %s", v.Version, v.APIVersion, d.Host())
	if _, err := cli.ImageInspect(context.Background(), d.Image()); err != nil {
		t.Errorf("test image: %v", err)
	}
	socks := runContainer(t, d)
	out, err := exec.Command("ip", "netns", "exec", d.Netns(), "iptables", "-w", "-S").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "DOCKER-ISOLATION-STAGE-1") {
		t.Errorf("the daemon's iptables chains are not in its namespace: %v\n%s", err, out)
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	checkGone(t, d, socks, before)
}

// TestCrash kills dockerd and its containerd with SIGKILL while a
// container runs: the shim and the container go on, and Stop must still
// leave nothing.
func TestCrash(t *testing.T) {
	skipShort(t)
	before := hostNetState(t)
	d, err := New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	socks := runContainer(t, d)
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	killNamed(t, d, "containerd")
	time.Sleep(500 * time.Millisecond)
	if len(d.pids()) == 0 {
		t.Fatalf("nothing of the daemon survived the crash: the test tests nothing")
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("stop after crash: %v", err)
	}
	checkGone(t, d, socks, before)
}

func killNamed(t *testing.T, d *Daemon, comm string) {
	t.Helper()
	for _, pid := range d.pids() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(b)) == comm {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// TestLeftoversOfKilledProcess starts a daemon from a child test
// process, kills that process and every process of the daemon with
// SIGKILL, as the end of a session does, and checks that the next
// Start's clean-up removes everything.
func TestLeftoversOfKilledProcess(t *testing.T) {
	skipShort(t)
	if os.Getenv("KNOTLESS_DOCKERD_CHILD") == "1" {
		return // the child's part is TestChildDaemon
	}
	before := hostNetState(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildDaemon$", "-test.v")
	cmd.Env = append(os.Environ(), "KNOTLESS_DOCKERD_CHILD=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var dir string
	var socks []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "READY" {
			dir, socks = f[1], f[2:]
			break
		}
	}
	if dir == "" {
		t.Fatalf("the child never started its daemon")
	}
	d := Find(dir)
	// Hold the lock on Base, so that no other test process's start
	// cleans the child's leftovers before this test looks at them.
	global, err := lockBase()
	if err != nil {
		t.Fatal(err)
	}
	defer global.Close()
	// Everything dies at once, as at the end of a session.
	_ = cmd.Process.Kill()
	for _, pid := range d.pids() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = cmd.Wait()
	time.Sleep(500 * time.Millisecond)
	if len(d.Leftovers()) == 0 {
		t.Fatalf("the killed child left nothing: the test tests nothing")
	}
	t.Logf("left by the killed child:\n%s", strings.Join(d.Leftovers(), "\n"))
	if err := cleanDead(); err != nil {
		t.Fatalf("clean: %v", err)
	}
	global.Close()
	checkGone(t, d, socks, before)
}

// TestChildDaemon is the child of TestLeftoversOfKilledProcess: it starts
// a daemon with a running container and waits to be killed.
func TestChildDaemon(t *testing.T) {
	if os.Getenv("KNOTLESS_DOCKERD_CHILD") != "1" {
		t.Skip("run only as the child of TestLeftoversOfKilledProcess")
	}
	d, err := New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	socks := runContainer(t, d)
	fmt.Printf("READY %s %s\n", d.Dir(), strings.Join(socks, " "))
	time.Sleep(10 * time.Minute)
}
