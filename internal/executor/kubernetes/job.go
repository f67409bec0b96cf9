package kubernetes

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/class"
)

// Label and annotation keys on every object a run creates.
const (
	LabelRunner    = executor.LabelRunner
	LabelRun       = executor.LabelRun
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// LabelEgress on a run pod names its egress mode: the policy of
	// that mode (BuildEgressPolicy) selects it.
	LabelEgress   = "dev.knotless.egress"
	AnnotationDID = "dev.knotless.runner-did"
	// AnnotationDriver on a run's Job names the replica that drives it
	// (Config.Driver); on the Job alone, not its pod, so that a
	// survivor may take the run by changing it.
	AnnotationDriver = "dev.knotless.driver"
	// AnnotationDriverInvocation is the driving process (a replica's
	// name outlives its processes): a claim by a restarted process of
	// the same replica changes it, so a survivor's claim made from an
	// older read of the Job fails.
	AnnotationDriverInvocation = "dev.knotless.driver-invocation"
	managedByValue             = "knotless-run"
	containerName              = "run"
	stateDir                   = "/knotless"
	stepStateDir               = stateDir + "/steps"
	// transferDir stages a whole transfer out on the node's disk (not
	// the state tmpfs): the pod hashes it in one pass, not through a tee.
	// A transfer in at / leaves its closing entry there.
	transferDir     = stateDir + "/transfer"
	jobNamePrefix   = "knotless-"
	networkPolicyNm = "knotless-deny-ingress-"
	egressPolicyNm  = "knotless-egress-"
)

// deadlineMargin is added to a run's timeout for the Job's active
// deadline: transfers and clean-up happen outside the steps.
const deadlineMargin = 10 * time.Minute

// defaultDeadline bounds a run with no timeout of its own.
const defaultDeadline = 6 * time.Hour

// ttlAfterFinished lets the TTL controller remove a Job the runner could
// not delete itself.
const ttlAfterFinished = 10 * time.Minute

// admissionRetries is how many pods of a run its nodes may refuse at
// admission before the run ends. A kubelet refuses a pod the scheduler
// placed by a newer view of the node (labels just added: the scale-up
// signal answered); the next pod is placed by what both agree on.
const admissionRetries = 2

// RunAsUser is the user (and group, and the volumes' group) that steps
// run as by default: not root, so the pod passes Pod Security
// "restricted". The run directories are emptyDirs, which the kubelet
// makes writable by every user, and group-owned by this GID (fsGroup).
const RunAsUser = 1000

// rootCapabilities are the only ones a root run (PodOptions.AllowRoot)
// keeps: what package managers and build tools running as root in the
// image need to own and chmod files and to switch users. Everything
// else, NET_RAW among it, is dropped. A default (non-root) run keeps none.
func rootCapabilities() []corev1.Capability {
	return []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID"}
}

// podSecurity returns the pod's and every container's security context.
// By default they meet Pod Security "restricted": a non-root numeric
// user, no privilege escalation, seccomp RuntimeDefault, every
// capability dropped. allowRoot (the operator's opt-out for images that
// need root) keeps root and the six capabilities of rootCapabilities,
// which meets "baseline" only.
func podSecurity(allowRoot bool) (*corev1.PodSecurityContext, *corev1.SecurityContext) {
	pod := &corev1.PodSecurityContext{
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	ctr := &corev1.SecurityContext{
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	if allowRoot {
		ctr.Capabilities.Add = rootCapabilities()
		return pod, ctr
	}
	pod.RunAsNonRoot = ptr.To(true)
	pod.RunAsUser = ptr.To[int64](RunAsUser)
	pod.RunAsGroup = ptr.To[int64](RunAsUser)
	pod.FSGroup = ptr.To[int64](RunAsUser)
	ctr.RunAsNonRoot = ptr.To(true)
	ctr.RunAsUser = ptr.To[int64](RunAsUser)
	ctr.RunAsGroup = ptr.To[int64](RunAsUser)
	return pod, ctr
}

// keepAlive is the pod's command: it works in any image with a POSIX sh,
// reaps orphans (it is PID 1), and exits at once on SIGTERM. It first
// makes the step tool's wake pipe and holds it open on its fd 3: a FIFO
// made and unlinked at once, so that no path in the pod leads to it (a
// step that reads every file of a directory never blocks on it); the
// step tool opens it as /proc/1/fd/3. In an image without mkfifo there is
// none, and the tool naps with sleep.
const keepAlive = `f=` + stateDir + `/.wake; if mkfifo -m 600 "$f" 2>/dev/null && [ -p "$f" ]; then exec 3<>"$f"; rm -f "$f"; fi; ` +
	`trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done`

// RunnerLabel is executor.RunnerLabel, the value of LabelRunner for a
// runner's DID, for the callers that build selectors with this package's
// names.
func RunnerLabel(did string) string { return executor.RunnerLabel(did) }

// JobName is the name of a run's Job.
func JobName(runID string) string {
	return jobNamePrefix + runID
}

// PodOptions are the operator's settings for run pods.
type PodOptions struct {
	Image          string
	CPURequest     string
	MemoryRequest  string
	CPULimit       string
	MemoryLimit    string
	RuntimeClass   string
	NodeSelector   map[string]string
	Tolerations    []corev1.Toleration
	ServiceAccount string
	// ImagePullSecrets name Secrets of the runs namespace (made by the
	// operator; the runner never creates one) that the kubelet uses to
	// pull the run image, each for the images its pattern matches and,
	// unless marked, for trusted runs only.
	ImagePullSecrets []PullSecret
	// Egress is what run pods may send out, by the run's trust; each
	// pod is labelled with its mode.
	Egress Egress
	// StateSizeLimit bounds the memory-backed volume that holds step
	// output spools.
	StateSizeLimit string
	// AllowRoot runs steps as the image's user (root, mostly) with the
	// capabilities root build tools need, for images that cannot work
	// otherwise. Such pods meet Pod Security "baseline", not
	// "restricted": the runs namespace must be labelled for it.
	AllowRoot bool
	// DefaultClass is the class of a run whose workflow names none
	// (class.Set.Pick("")): warm pods are made in it. Unset (no Name),
	// New sets the built-in one.
	DefaultClass class.Class
}

// BuildJob returns the Job for one run. It is pure: everything it needs
// is in its arguments.
func BuildJob(namespace string, spec executor.Spec, opts PodOptions) (*batchv1.Job, error) {
	pod, err := buildPod(spec, opts)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{LabelRunner: RunnerLabel(spec.Runner), LabelRun: spec.RunID, LabelManagedBy: managedByValue,
		LabelEgress: string(opts.Egress.For(spec.Trusted))}
	annotations := map[string]string{AnnotationDID: spec.Runner}
	if len(spec.StepImages) > 0 {
		byStep, _, _ := stepContainerNames(spec.StepImages)
		annotations[AnnotationStepContainers] = stepContainersAnnotation(byStep)
	}
	for k, v := range spec.Annotations {
		annotations[k] = v
	}
	// The pod's own: the cluster autoscaler keeps its node while the
	// run holds it (with the run's disruption budget, which the
	// autoscaler and every drain respect too). A warm pod says "true"
	// until a run takes it (warm.go).
	podAnnotations := map[string]string{AnnotationSafeToEvict: "false"}
	if len(spec.Services) > 0 {
		podAnnotations[AnnotationServiceTimeouts] = serviceTimeouts(spec.Services)
	}
	for k, v := range annotations {
		podAnnotations[k] = v
	}
	deadline := defaultDeadline
	if spec.Timeout > 0 {
		deadline = spec.Timeout + deadlineMargin
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: JobName(spec.RunID), Namespace: namespace, Labels: labels, Annotations: annotations},
		Spec: batchv1.JobSpec{
			// A pod that ran is never replaced: any exit but 0, and any
			// disruption (eviction, preemption, a lost node), fails the
			// Job. A pod its node refused at admission ran nothing; it
			// counts against the backoff limit, and the Job makes another.
			BackoffLimit: ptr.To[int32](admissionRetries),
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{
					Action:          batchv1.PodFailurePolicyActionFailJob,
					OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
				},
				{
					Action:      batchv1.PodFailurePolicyActionFailJob,
					OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpNotIn, Values: []int32{0}},
				},
			}},
			ActiveDeadlineSeconds: ptr.To(int64(deadline / time.Second)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: podAnnotations},
				Spec:       pod,
			},
		},
	}
	if !spec.Keep {
		job.Spec.TTLSecondsAfterFinished = ptr.To(int32(ttlAfterFinished / time.Second))
	}
	return job, nil
}

// buildPod is the pod of a run's Job: one container that keeps the pod
// alive for the steps' execs, in the run's image with its resources,
// the run's directories mounted, the pull credentials its trust allows,
// locked down, and alone on its node among this runner's runs.
func buildPod(spec executor.Spec, opts PodOptions) (corev1.PodSpec, error) {
	image := spec.Image
	if image == "" {
		image = opts.Image
	}
	res, err := resources(spec.Resources, spec.Class, opts)
	if err != nil {
		return corev1.PodSpec{}, err
	}
	if spec.Class.Pids > 0 {
		return corev1.PodSpec{}, fmt.Errorf("class %s: pids: a Kubernetes pod has no process bound of its own (the kubelet's podPidsLimit sets one for every pod)", spec.Class.Name)
	}
	volumes, mounts, err := runVolumes(spec.Caches, opts.StateSizeLimit)
	if err != nil {
		return corev1.PodSpec{}, err
	}
	pullSecrets, pullPolicy := pullCredentials(opts.ImagePullSecrets, image, spec.Trusted)
	podSC, containerSC := podSecurity(opts.AllowRoot)
	pod := corev1.PodSpec{
		RestartPolicy:                 corev1.RestartPolicyNever,
		AutomountServiceAccountToken:  ptr.To(false),
		EnableServiceLinks:            ptr.To(false),
		TerminationGracePeriodSeconds: ptr.To[int64](5),
		ServiceAccountName:            opts.ServiceAccount,
		NodeSelector:                  nodeSelector(opts.NodeSelector, spec.Class.NodeSelector),
		Tolerations:                   tolerations(opts.Tolerations, spec.Class.Tolerations),
		SecurityContext:               podSC,
		// One run per node: a run never shares a node with another run of
		// this runner.
		Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelRunner: RunnerLabel(spec.Runner)}},
				TopologyKey:   corev1.LabelHostname,
			}},
		}},
		Volumes: volumes,
		Containers: []corev1.Container{{
			Name:            containerName,
			Image:           image,
			ImagePullPolicy: pullPolicy,
			Command:         []string{"sh", "-c", keepAlive},
			WorkingDir:      executor.PodDirs().Work,
			Resources:       res,
			VolumeMounts:    mounts,
			SecurityContext: containerSC,
		}},
	}
	steps, stepPullSecrets, err := stepContainers(spec, opts, mounts, containerSC)
	if err != nil {
		return corev1.PodSpec{}, err
	}
	pod.Containers = append(pod.Containers, steps...)
	services, servicePullSecrets, err := serviceContainers(spec.Services, opts, spec.Class.EphemeralStorage, spec.Trusted, containerSC)
	if err != nil {
		return corev1.PodSpec{}, err
	}
	pod.Containers = append(pod.Containers, services...)
	servicePullSecrets = append(stepPullSecrets, servicePullSecrets...)
	for _, name := range servicePullSecrets {
		if !slices.Contains(pullSecrets, name) {
			pullSecrets = append(pullSecrets, name)
		}
	}
	for _, name := range pullSecrets {
		pod.ImagePullSecrets = append(pod.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
	}
	if opts.RuntimeClass != "" {
		pod.RuntimeClassName = ptr.To(opts.RuntimeClass)
	}
	return pod, nil
}

// runVolumes are the run's directories as the pod's volumes and their
// mounts: the work, steps and outputs directories, the step spools'
// state (in memory, at most stateSizeLimit, default 256Mi), the
// transfer directory, and an emptyDir per absolute cache directory.
func runVolumes(caches []string, stateSizeLimit string) ([]corev1.Volume, []corev1.VolumeMount, error) {
	stateLimit := resource.MustParse("256Mi")
	if stateSizeLimit != "" {
		var err error
		if stateLimit, err = resource.ParseQuantity(stateSizeLimit); err != nil {
			return nil, nil, fmt.Errorf("state size limit %q: %w", stateSizeLimit, err)
		}
	}
	volumes := []corev1.Volume{
		{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "steps", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "outputs", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		// Step output spools: memory, never the node's disk.
		{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &stateLimit}}},
		{Name: "transfer", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	dirs := executor.PodDirs()
	mounts := []corev1.VolumeMount{
		{Name: "work", MountPath: dirs.Work},
		{Name: "steps", MountPath: dirs.Steps},
		{Name: "outputs", MountPath: dirs.Outputs},
		{Name: "state", MountPath: stateDir},
		{Name: "transfer", MountPath: transferDir},
	}
	// An emptyDir per absolute cache directory: a non-root step cannot
	// make one in the image's file system.
	for i, dir := range caches {
		name := "cache-" + strconv.Itoa(i)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: dir})
	}
	return volumes, mounts, nil
}

// nodeSelector is the operator's node selector with the class's over
// it.
func nodeSelector(all, class map[string]string) map[string]string {
	if len(class) == 0 {
		return all
	}
	out := make(map[string]string, len(all)+len(class))
	for k, v := range all {
		out[k] = v
	}
	for k, v := range class {
		out[k] = v
	}
	return out
}

// tolerations are the operator's tolerations and then the class's.
func tolerations(all []corev1.Toleration, cls []class.Toleration) []corev1.Toleration {
	if len(cls) == 0 {
		return all
	}
	out := append([]corev1.Toleration(nil), all...)
	for _, t := range cls {
		ct := corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffect(t.Effect)}
		if t.Value != "" {
			ct.Operator, ct.Value = corev1.TolerationOpEqual, t.Value
		}
		out = append(out, ct)
	}
	return out
}

// resources merges the workflow's requests (clamped to its class
// already) over the operator's defaults; the class's bounds are the
// limits, over the operator's, and its ephemeral storage the pod's disk
// limit, past which the kubelet evicts the pod. A default request above
// the class's limit is lowered to it.
func resources(wf executor.Resources, cls class.Class, opts PodOptions) (corev1.ResourceRequirements, error) {
	var rr corev1.ResourceRequirements
	set := func(list *corev1.ResourceList, name corev1.ResourceName, values ...string) error {
		for _, v := range values {
			if v == "" {
				continue
			}
			q, err := resource.ParseQuantity(v)
			if err != nil {
				return fmt.Errorf("%s %q: %w", name, v, err)
			}
			if *list == nil {
				*list = corev1.ResourceList{}
			}
			(*list)[name] = q
			return nil
		}
		return nil
	}
	for _, err := range []error{
		set(&rr.Requests, corev1.ResourceCPU, wf.CPU, opts.CPURequest),
		set(&rr.Requests, corev1.ResourceMemory, wf.Memory, opts.MemoryRequest),
		set(&rr.Limits, corev1.ResourceCPU, cls.CPU, opts.CPULimit),
		set(&rr.Limits, corev1.ResourceMemory, cls.Memory, opts.MemoryLimit),
		set(&rr.Limits, corev1.ResourceEphemeralStorage, cls.EphemeralStorage),
	} {
		if err != nil {
			return rr, err
		}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := rr.Requests[name]
		lim, hasLim := rr.Limits[name]
		if hasReq && hasLim && req.Cmp(lim) > 0 {
			rr.Requests[name] = lim
		}
	}
	return rr, nil
}
