package kubernetes

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"knotless.dev/run/internal/executor"
)

// AnnotationStepContainers on a run's Job and pod names the container
// of each step that has an image of its own ("2=step-2,4=step-2"); a step
// it does not name runs in the run container.
const AnnotationStepContainers = "dev.knotless.step-containers"

// stepContainerNames maps each step of stepImages to its container:
// one container per image, named after the first step that names it.
func stepContainerNames(stepImages map[string]string) (byStep map[string]string, order []string, images map[string]string) {
	ids := make([]string, 0, len(stepImages))
	for id := range stepImages {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, _ := strconv.Atoi(ids[i])
		b, _ := strconv.Atoi(ids[j])
		return a < b
	})
	byStep, images = map[string]string{}, map[string]string{}
	byImage := map[string]string{}
	for _, id := range ids {
		img := stepImages[id]
		name, ok := byImage[img]
		if !ok {
			name = "step-" + id
			byImage[img] = name
			images[name] = img
			order = append(order, name)
		}
		byStep[id] = name
	}
	return byStep, order, images
}

// stepContainersAnnotation is the annotation's value.
func stepContainersAnnotation(byStep map[string]string) string {
	parts := make([]string, 0, len(byStep))
	for id, name := range byStep {
		parts = append(parts, id+"="+name)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// parseStepContainers reads the annotation.
func parseStepContainers(v string) map[string]string {
	if v == "" {
		return nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		if id, name, ok := strings.Cut(kv, "="); ok {
			out[id] = name
		}
	}
	return out
}

// stepContainers are the containers of the steps with images of their
// own: each like the run container (the keep-alive, the run's
// directories and state mounted, locked down), in its image with the
// pull credentials the run's trust allows, asking for nothing of its
// own beyond the operator's limits: the steps run one at a time.
func stepContainers(spec executor.Spec, opts PodOptions, mounts []corev1.VolumeMount, sc *corev1.SecurityContext) ([]corev1.Container, []string, error) {
	if len(spec.StepImages) == 0 {
		return nil, nil, nil
	}
	res, err := serviceResources(opts, spec.Class.EphemeralStorage)
	if err != nil {
		return nil, nil, err
	}
	_, order, images := stepContainerNames(spec.StepImages)
	var out []corev1.Container
	var pullSecrets []string
	for _, name := range order {
		secrets, policy := pullCredentials(opts.ImagePullSecrets, images[name], spec.Trusted)
		pullSecrets = append(pullSecrets, secrets...)
		out = append(out, corev1.Container{
			Name:            name,
			Image:           images[name],
			ImagePullPolicy: policy,
			Command:         []string{"sh", "-c", keepAlive},
			WorkingDir:      executor.PodDirs().Work,
			Resources:       res,
			VolumeMounts:    slices.Clone(mounts),
			SecurityContext: sc.DeepCopy(),
		})
	}
	return out, pullSecrets, nil
}

// stepContainer is the container step id runs in.
func (s *Session) stepContainer(id string) string {
	if name, ok := s.stepContainers[id]; ok {
		return name
	}
	return containerName
}
