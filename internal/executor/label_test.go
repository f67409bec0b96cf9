package executor

import (
	"regexp"
	"testing"
)

// TestRunnerLabel pins the value: the Kubernetes executor finds the Jobs
// and pods of runs started by an earlier build by it, so a change of
// length or hash strands them (the Docker sweep also tries the 16-digit
// value of builds before the executors shared this function).
func TestRunnerLabel(t *testing.T) {
	t.Parallel()
	if got, want := RunnerLabel("did:plc:runner"), "abfc473eab8f35350bd5"; got != want {
		t.Errorf("RunnerLabel(did:plc:runner) = %q, want %q", got, want)
	}
	labelValue := regexp.MustCompile(`^[a-z0-9]{20}$`)
	for _, did := range []string{"did:web:example.com:user/with:odd%chars", "did:plc:" + string(make([]byte, 300))} {
		if got := RunnerLabel(did); !labelValue.MatchString(got) {
			t.Errorf("RunnerLabel(%q) = %q, not a 20-character label value", did, got)
		}
	}
}
