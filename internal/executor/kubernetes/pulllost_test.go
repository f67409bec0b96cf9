package kubernetes

import (
	"errors"
	"testing"

	"knotless.dev/run/internal/executor"
)

func TestPullLost(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		message string
		lost    bool
	}{
		{`failed to pull and unpack image "r.example/a:1": failed to do request: Head "https://r.example/v2/a/manifests/1": dial tcp 10.0.0.9:443: i/o timeout`, true},
		{`failed to pull image "r.example/a:1": received unexpected HTTP status: 503 Service Unavailable`, true},
		{`failed to pull image "docker.io/a:1": toomanyrequests: You have reached your pull rate limit`, true},
		{`failed to pull image "r.example/a:1": read tcp 10.0.0.2:5000->10.0.0.9:443: read: connection reset by peer`, true},
		{`failed to pull and unpack image "docker.io/library/nope:1": failed to resolve reference "docker.io/library/nope:1": docker.io/library/nope:1: not found`, false},
		{`failed to pull image "r.example/a:1": pull access denied, repository does not exist or may require authorization`, false},
		{`failed to do request: Head "https://nowhere.invalid/v2/": dial tcp: lookup nowhere.invalid: no such host`, false},
		{`Back-off pulling image "127.0.0.1:1/a:1"`, false},
	} {
		got := errors.Is(pullLost(tt.message, errors.New("pull")), executor.ErrInfrastructure)
		if got != tt.lost {
			t.Errorf("pullLost(%q) marked the infrastructure's: %v, want %v", tt.message, got, tt.lost)
		}
	}
}
