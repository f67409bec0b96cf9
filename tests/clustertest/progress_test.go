package clustertest_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestBuildProgress: up's build progress (ktc_progress in lib.sh) counts
// the package paths `go build -v` prints against the total, passes any
// other line through, and ends with the count.
func TestBuildProgress(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	lib := filepath.Join(filepath.Dir(file), "..", "cluster", "lib.sh")
	// KTC_PROGRESS_EVERY=0: a progress line after every line read, so
	// the counts do not depend on time.
	script := `. "$1"; KTC_PROGRESS_EVERY=0; printf '%s\n' k8s.io/api/core/v1 '# k8s.io/foo: an error' runtime/internal/sys k8s.io/kubernetes/cmd/kube | ktc_progress 4`
	out, err := exec.Command("bash", "-c", script, "bash", lib).CombinedOutput()
	if err != nil {
		t.Fatalf("ktc_progress: %v\n%s", err, out)
	}
	var counts []string
	for _, m := range regexp.MustCompile(`building: (\d+) of 4 packages compiled`).FindAllStringSubmatch(string(out), -1) {
		counts = append(counts, m[1])
	}
	if want := []string{"1", "1", "2", "3"}; !slices.Equal(counts, want) {
		t.Errorf("progress counts %v, want %v:\n%s", counts, want, out)
	}
	if !strings.Contains(string(out), "\n# k8s.io/foo: an error\n") || !strings.Contains(string(out), "go build ended: 3 packages compiled in") {
		t.Errorf("want the error line passed through and the end counted:\n%s", out)
	}
}
