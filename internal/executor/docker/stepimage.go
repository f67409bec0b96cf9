package docker

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"knotless.dev/run/internal/executor"
)

// LabelStep on the container of steps with an image of their own names
// the first such step.
const LabelStep = "dev.knotless.step"

// startStepContainers creates and starts a container per image that
// steps name for themselves (Spec.StepImages), named after the first
// step that names it: like the run container (the keep-alive, the run's
// volumes, its hardening and limits) in the run container's network
// namespace. The containers made are in s.stepCtrs for remove, whatever
// fails.
func (s *Session) startStepContainers(ctx context.Context, spec executor.Spec, mounts []mount.Mount, labels map[string]string, res container.Resources) error {
	if len(spec.StepImages) == 0 {
		return nil
	}
	e := s.ex
	ids := make([]string, 0, len(spec.StepImages))
	for id := range spec.StepImages {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, _ := strconv.Atoi(ids[i])
		b, _ := strconv.Atoi(ids[j])
		return a < b
	})
	yes := true
	pids := e.cfg.PidsLimit
	res.PidsLimit = &pids
	s.stepCtrs = map[string]string{}
	byImage := map[string]string{}
	for _, id := range ids {
		image := spec.StepImages[id]
		if ctr, ok := byImage[image]; ok {
			s.stepCtrs[id] = ctr
			continue
		}
		if err := e.ensureImage(ctx, image, s.log); err != nil {
			return fmt.Errorf("step %s: %w", id, err)
		}
		sl := map[string]string{LabelStep: id}
		for k, v := range labels {
			sl[k] = v
		}
		name := s.names.container + "-step-" + id
		created, err := e.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
			Name: name,
			Config: &container.Config{
				Image:      image,
				Entrypoint: []string{"sh", "-c", keepAlive},
				Cmd:        []string{},
				WorkingDir: "/work",
				Labels:     sl,
				StopSignal: "SIGTERM",
			},
			HostConfig: &container.HostConfig{
				NetworkMode:  container.NetworkMode("container:" + s.id),
				Mounts:       mounts,
				Init:         &yes,
				CapDrop:      []string{"ALL"},
				CapAdd:       e.cfg.Capabilities,
				SecurityOpt:  []string{"no-new-privileges"},
				IpcMode:      container.IPCModePrivate,
				CgroupnsMode: container.CgroupnsModePrivate,
				LogConfig:    container.LogConfig{Type: "none"},
				Resources:    res,
			},
		})
		if err != nil {
			return e.daemonError(fmt.Errorf("create container %s of step %s: %w", name, id, err))
		}
		byImage[image], s.stepCtrs[id] = created.ID, created.ID
		if _, err := e.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
			return e.daemonError(fmt.Errorf("start container %s of step %s: %w", name, id, err))
		}
		in, err := e.cli.ContainerInspect(ctx, created.ID, client.ContainerInspectOptions{})
		if err != nil {
			return e.daemonError(fmt.Errorf("inspect container %s: %w", name, err))
		}
		if st := in.Container.State; st == nil || !st.Running {
			return fmt.Errorf("container %s of step %s, image %s, exited at once: the image needs a POSIX sh and sleep", name, id, image)
		}
	}
	return nil
}

// stepContainer is the id of the container step id runs in.
func (s *Session) stepContainer(id string) string {
	if ctr, ok := s.stepCtrs[id]; ok {
		return ctr
	}
	return s.id
}

// stepCtrIDs are the ids of the steps' own containers, each once.
func (s *Session) stepCtrIDs() []string {
	seen := map[string]bool{}
	var out []string
	for _, ctr := range s.stepCtrs {
		if !seen[ctr] {
			seen[ctr] = true
			out = append(out, ctr)
		}
	}
	sort.Strings(out)
	return out
}
