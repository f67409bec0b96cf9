package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"knotless.dev/run/internal/daemon"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
	"knotless.dev/run/internal/kube/replicas"
)

// replicaName is this process's name among the runner's replicas with
// --replicas ("" without): --replica-name, or the host's name.
func (c *ServeCmd) replicaName() (string, error) {
	if !c.Replicas {
		if c.ReplicaName != "" {
			return "", usageError{errors.New("--replica-name is for --replicas")}
		}
		return "", nil
	}
	if c.Executor != kubernetes.Name && c.Executor != "kube" {
		return "", usageError{fmt.Errorf("--replicas with --executor %s: replicas coordinate through the cluster, so only --executor kubernetes runs as several processes of one runner", c.Executor)}
	}
	name := c.ReplicaName
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("--replicas: no --replica-name, and the host's name: %w", err)
		}
		name = host
	}
	// The name is a label value's shape: it is shown and compared, never
	// a path or an object's name (the Lease's is a digest of it).
	if errs := validation.IsValidLabelValue(name); len(errs) > 0 || name == "" {
		return "", usageError{fmt.Errorf("--replica-name %q: want 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", name)}
	}
	return name, nil
}

// invocation is this process among those of its replica name:
// systemd's INVOCATION_ID, or its pid and start.
func invocation(env *Env) string {
	if id := env.Getenv("INVOCATION_ID"); id != "" {
		return id
	}
	return fmt.Sprintf("pid-%d-%d", os.Getpid(), time.Now().UnixNano())
}

// joinReplicas is how serve --replicas joins the runner's replicas, once
// the daemon holds its state directory: a Lease named after the
// replica, in the executor's namespace, through its credentials. nil
// without --replicas.
func (c *ServeCmd) joinReplicas(exec executor.Executor, runner, name, invocation string, log *slog.Logger) func(context.Context, func()) (daemon.Replicas, error) {
	if name == "" {
		return nil
	}
	kex, ok := exec.(*kubernetes.Executor)
	if !ok {
		return nil
	}
	return func(ctx context.Context, changed func()) (daemon.Replicas, error) {
		set, err := replicas.Join(ctx, replicas.Config{API: kex.API, Runner: runner, Name: name, Invocation: invocation,
			Logger: log, Changed: changed})
		if err != nil {
			return nil, err
		}
		return replicas.Both(set), nil
	}
}
