package hostclean

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// mountinfo is a hybrid (cgroup v1 with a unified hierarchy) host's, cut
// down, with a test directory whose mounts have escaped names.
const mountinfo = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755
27 26 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:25 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
29 26 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,cpu,cpuacct
30 26 0:27 / /sys/fs/cgroup/odd\040name rw,relatime - cgroup cgroup rw,pids
40 22 0:40 / /tmp/knotless/ab12 rw,relatime - tmpfs tmpfs rw
41 40 0:41 / /tmp/knotless/ab12/data rw,relatime - tmpfs tmpfs rw
42 41 0:42 / /tmp/knotless/ab12/data/with\040space rw,relatime - overlay overlay rw
43 40 0:43 / /tmp/knotless/ab12/back\134slash rw,relatime - tmpfs tmpfs rw
44 22 0:44 / /tmp/knotless/ab123 rw,relatime - tmpfs tmpfs rw
45 22 0:45 / /tmp/knotless/ab1 rw,relatime - tmpfs tmpfs rw
garbage
`

func TestParseCgroupMounts(t *testing.T) {
	t.Parallel()
	got := parseCgroupMounts(mountinfo)
	want := []CgroupMount{
		{Point: "/sys/fs/cgroup/unified", FSType: "cgroup2", Options: "rw,nsdelegate"},
		{Point: "/sys/fs/cgroup/systemd", FSType: "cgroup", Options: "rw,xattr,name=systemd"},
		{Point: "/sys/fs/cgroup/cpu,cpuacct", FSType: "cgroup", Options: "rw,cpu,cpuacct"},
		{Point: "/sys/fs/cgroup/odd name", FSType: "cgroup", Options: "rw,pids"},
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("parseCgroupMounts (-got +want):\n%s", diff)
	}
}

func TestMountsUnder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, dir string
		want      []string
	}{
		{"deepest first, not siblings with a longer name", "/tmp/knotless/ab12", []string{
			"/tmp/knotless/ab12/data/with space",
			"/tmp/knotless/ab12/data",
			`/tmp/knotless/ab12/back\slash`,
			"/tmp/knotless/ab12",
		}},
		{"below a mount point", "/tmp/knotless/ab12/data", []string{
			"/tmp/knotless/ab12/data/with space",
			"/tmp/knotless/ab12/data",
		}},
		{"nothing", "/tmp/knotless/cd34", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := mountsUnder(mountinfo, tc.dir)
			if diff := cmp.Diff(got, tc.want); diff != "" {
				t.Errorf("mountsUnder(%q) (-got +want):\n%s", tc.dir, diff)
			}
		})
	}
}

func TestUnescapeMount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`/plain`, "/plain"},
		{`/a\040b`, "/a b"},
		{`/a\011b\012c`, "/a\tb\nc"},
		{`/a\134b`, `/a\b`},
		{`/a\134040b`, `/a\040b`},
	} {
		if got := unescapeMount(tc.in); got != tc.want {
			t.Errorf("unescapeMount(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestLocks checks that an instance's lock is exclusive while it is held
// and free once it is released, so that CleanDead passes over live
// instances and cleans dead ones, including those with only leftovers
// outside the base directory.
func TestLocks(t *testing.T) {
	t.Parallel()
	base := filepath.Join(t.TempDir(), "base")
	global, err := LockBase(base)
	if err != nil {
		t.Fatal(err)
	}
	defer global.Close()
	for _, id := range []string{"live", "dead", ".hidden"} {
		if err := os.Mkdir(filepath.Join(base, id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	live, err := LockDir(filepath.Join(base, "live"))
	if err != nil || live == nil {
		t.Fatalf("lock a new directory: %v, %v", live, err)
	}
	defer live.Close()
	// flock locks belong to the open file: a second open is another
	// holder, as another process would be.
	if again, err := LockDir(filepath.Join(base, "live")); err != nil || again != nil {
		t.Fatalf("lock a held directory: %v, %v; want nil, nil", again, err)
	}
	var cleaned []string
	err = CleanDead(base, []string{"cgroup-only", "dead"}, func(id string) error {
		cleaned = append(cleaned, id)
		return nil
	})
	if err != nil {
		t.Fatalf("CleanDead: %v", err)
	}
	if diff := cmp.Diff(cleaned, []string{"cgroup-only", "dead"}); diff != "" {
		t.Errorf("cleaned (-got +want):\n%s", diff)
	}
}
