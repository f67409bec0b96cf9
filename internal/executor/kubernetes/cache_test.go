package kubernetes

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"knotless.dev/run/internal/executor"
)

// TestCacheDirsAreEmptyDirs: a non-root step cannot create /cache in the
// image, so each absolute cache directory is an emptyDir of its own.
func TestCacheDirsAreEmptyDirs(t *testing.T) {
	t.Parallel()
	job, err := BuildJob("runs", executor.Spec{RunID: "r1", Runner: "did:plc:runner", Caches: []string{"/cache", "/home/go/cache"}}, PodOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	var got []string
	for _, m := range pod.Containers[0].VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && len(m.Name) > 6 && m.Name[:6] == "cache-" {
				if v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumDefault {
					t.Errorf("volume %s is not an emptyDir on the node's disk: %+v", v.Name, v.VolumeSource)
				}
				got = append(got, m.Name+"="+m.MountPath)
			}
		}
	}
	if diff := cmp.Diff([]string{"cache-0=/cache", "cache-1=/home/go/cache"}, got); diff != "" {
		t.Errorf("cache mounts (-want +got):\n%s", diff)
	}
}
