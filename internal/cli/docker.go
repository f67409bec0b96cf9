package cli

import (
	"fmt"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/docker"
)

// DockerFlags configure the docker executor.
type DockerFlags struct {
	DockerHost    string `help:"Docker daemon address (default: $$DOCKER_HOST, else unix:///var/run/docker.sock)." placeholder:"URL" group:"docker"`
	Network       string `help:"Network of run containers: empty for one network per run (runs cannot reach each other, except for a moment at each network create on Docker before 28 with --concurrency above 1), none, or the name of an existing network." group:"docker"`
	DockerCPU     string `help:"CPU limit of a run container when the workflow sets none." group:"docker"`
	DockerMemory  string `help:"Memory limit of a run container when the workflow sets none." group:"docker"`
	DockerPull    string `help:"Image pull policy: missing, never or always." enum:"missing,never,always" default:"missing" group:"docker"`
	DockerPidsMax int64  `help:"Most processes in a run container (default: 4096, as 0 is)." placeholder:"N" group:"docker"`
}

func (f *DockerFlags) executorDef() executorDef {
	return executorDef{
		Name: docker.Name,
		What: "a container per run",
		Dirs: executor.PodDirs(),
		New: func(env *Env, o executorOptions) (executor.Executor, error) {
			return f.newDocker(env, o)
		},
	}
}

func (f *DockerFlags) newDocker(env *Env, o executorOptions) (*docker.Executor, error) {
	host := f.DockerHost
	if host == "" {
		host = env.Getenv("DOCKER_HOST")
	}
	ex, err := docker.New(docker.Config{
		Host:        host,
		Network:     f.Network,
		CPU:         f.DockerCPU,
		Memory:      f.DockerMemory,
		PidsLimit:   f.DockerPidsMax,
		Pull:        docker.PullPolicy(f.DockerPull),
		Runner:      o.Runner,
		Concurrency: o.Concurrency,
		Limits:      o.Limits,
		Logger:      o.Logger,
		Observer:    o.Observer,
	})
	if err != nil {
		// docker.New reads the flags and dials nothing: what it
		// refuses is a flag's value (--docker-cpu, --docker-host, …).
		return nil, usageError{fmt.Errorf("--executor docker: %w", err)}
	}
	return ex, nil
}
