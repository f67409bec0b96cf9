package executor

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// Service is one container a session runs beside the steps for the
// whole run, reachable from every step at localhost on its ports. It
// never holds a secret: its env is in its container's spec.
type Service struct {
	Name  string
	Image string
	Env   []EnvVar
	Ports []int
	// Command, when set, replaces the image's entrypoint and arguments.
	Command []string
	Ready   Probe
}

// EnvVar is a plain variable.
type EnvVar struct {
	Name, Value string
}

// Probe is how a service is known to be ready: at most one of TCP,
// HTTPPath (on HTTPPort) or Command (a sh script in the service's
// container); none: ready once it runs. Timeout bounds the wait from
// when the service's container started.
type Probe struct {
	TCP      int
	HTTPPath string
	HTTPPort int
	Command  string
	Timeout  time.Duration
}

// ServiceRunner is a Session that runs its Spec's services. Start
// returns it only once every service is ready: a service that does not
// become ready within its timeout, or ends first, fails Start with a
// *ServiceError. An executor whose sessions are not ServiceRunners
// refuses a Spec with services.
type ServiceRunner interface {
	// WatchServices returns a *ServiceError once a service has ended
	// (or failed to be restarted), or nil when ctx ends first.
	WatchServices(ctx context.Context) error
	// ServiceLog writes the log of the service named name to w.
	ServiceLog(ctx context.Context, name string, w io.Writer) error
}

// ServiceError is a service that did not become ready, or ended while
// the run went on: the run ends error naming it.
type ServiceError struct {
	Service string
	// Why says what happened ("did not become ready within 10s (tcp
	// port 5432)", "exited 1").
	Why string
	// Tail is its last log lines.
	Tail string
}

func (e *ServiceError) Error() string {
	msg := fmt.Sprintf("service %s %s", e.Service, e.Why)
	if t := strings.TrimRight(e.Tail, "\n"); t != "" {
		msg += "; its last log lines:\n" + t
	} else {
		msg += "; it logged nothing"
	}
	return msg
}

// ServiceTailLines is how many of a failed service's last log lines its
// ServiceError holds.
const ServiceTailLines = 20

// NoServices is the error of an executor that runs no services for a
// Spec that has some, naming the first.
func NoServices(executor string, spec Spec) error {
	if len(spec.Services) == 0 {
		return nil
	}
	return fmt.Errorf("the %s executor runs no services, and the workflow names service %s", executor, spec.Services[0].Name)
}

// NoStepImages is the error of an executor that runs every step in one
// place for a Spec whose steps name images of their own, naming the
// first such step.
func NoStepImages(executor string, spec Spec) error {
	if len(spec.StepImages) == 0 {
		return nil
	}
	first := ""
	for id := range spec.StepImages {
		if n, m := len(id), len(first); first == "" || n < m || n == m && id < first {
			first = id
		}
	}
	return fmt.Errorf("the %s executor runs every step in one place, and step %s names an image of its own (%s)", executor, first, spec.StepImages[first])
}
