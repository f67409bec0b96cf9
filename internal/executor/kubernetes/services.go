package kubernetes

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeclient"
	"knotless.dev/run/internal/rules/class"
)

// serviceContainerPrefix begins the name of a service's container in the
// run's pod; the rest is the service's name.
const serviceContainerPrefix = "svc-"

// serviceContainer is the name of service name's container.
func serviceContainer(name string) string { return serviceContainerPrefix + name }

// serviceOf is the service a container of the run's pod runs, or "".
func serviceOf(container string) string {
	name, ok := strings.CutPrefix(container, serviceContainerPrefix)
	if !ok {
		return ""
	}
	return name
}

// serviceContainers are the containers of spec's services: beside the
// run container in its pod, so a step reaches each at localhost. Each
// runs locked down like the steps, with the operator's limits, and its
// probe as a readiness probe: the pod is Ready, and Start returns, once
// every service is. A service gets no volume of the run's: its env is
// all it is given, and never a secret.
func serviceContainers(services []executor.Service, opts PodOptions, storage string, trusted bool, sc *corev1.SecurityContext) ([]corev1.Container, []string, error) {
	var out []corev1.Container
	var pullSecrets []string
	limits, err := serviceResources(opts, storage)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range services {
		secrets, policy := pullCredentials(opts.ImagePullSecrets, s.Image, trusted)
		pullSecrets = append(pullSecrets, secrets...)
		c := corev1.Container{
			Name:            serviceContainer(s.Name),
			Image:           s.Image,
			ImagePullPolicy: policy,
			Command:         s.Command,
			Resources:       limits,
			SecurityContext: sc.DeepCopy(),
			ReadinessProbe:  readinessProbe(s.Ready),
		}
		for _, e := range s.Env {
			c.Env = append(c.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
		}
		for _, p := range s.Ports {
			c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: int32(p), Protocol: corev1.ProtocolTCP})
		}
		out = append(out, c)
	}
	return out, pullSecrets, nil
}

// serviceResources are a side container's (a service, a step's own
// image): the operator's limits and the run's class's disk bound
// (storage: without a limit on every container, the kubelet bounds no
// pod's emptyDirs), and requests of zero, so that the limits are not
// taken as its requests too (the API server's default): the run's
// requests are the run container's, and a side container adds none to
// what the pod asks a node for.
func serviceResources(opts PodOptions, storage string) (corev1.ResourceRequirements, error) {
	rr, err := resources(executor.Resources{}, class.Class{EphemeralStorage: storage}, PodOptions{CPULimit: opts.CPULimit, MemoryLimit: opts.MemoryLimit})
	if err != nil {
		return rr, err
	}
	for name := range rr.Limits {
		if rr.Requests == nil {
			rr.Requests = corev1.ResourceList{}
		}
		rr.Requests[name] = resource.MustParse("0")
	}
	return rr, nil
}

// readinessProbe is a service's probe as the kubelet runs it, every
// second; nil (ready once running) for none.
func readinessProbe(p executor.Probe) *corev1.Probe {
	var h corev1.ProbeHandler
	switch {
	case p.TCP != 0:
		h.TCPSocket = &corev1.TCPSocketAction{Port: intstr.FromInt(p.TCP)}
	case p.HTTPPath != "":
		h.HTTPGet = &corev1.HTTPGetAction{Path: p.HTTPPath, Port: intstr.FromInt(p.HTTPPort)}
	case p.Command != "":
		h.Exec = &corev1.ExecAction{Command: []string{"sh", "-c", p.Command}}
	default:
		return nil
	}
	return &corev1.Probe{ProbeHandler: h, PeriodSeconds: 1, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 1}
}

// AnnotationServiceTimeouts on a run's pod holds each service's start
// timeout ("db=10s,web=1m0s"), which the pod's wait reads.
const AnnotationServiceTimeouts = "dev.knotless.service-timeouts"

// serviceTimeouts is the annotation's value for services.
func serviceTimeouts(services []executor.Service) string {
	parts := make([]string, len(services))
	for i, s := range services {
		parts[i] = s.Name + "=" + s.Ready.Timeout.String()
	}
	return strings.Join(parts, ",")
}

// serviceWait is what a pod waiter checks of a run's services before
// the pod is Ready: one that ended, or that is not ready within its
// start timeout from its container's start, ends the wait naming it.
// It is read from the pod itself.
type serviceWait struct {
	timeouts map[string]time.Duration // by service name
}

// check returns a *executor.ServiceError for the first service of pod
// that ended or is late, with its last log lines.
func (w *serviceWait) check(ctx context.Context, cs *kubeclient.Clientset, pod *corev1.Pod, now time.Time) error {
	v := pod.Annotations[AnnotationServiceTimeouts]
	if v == "" {
		return nil
	}
	if w.timeouts == nil {
		w.timeouts = map[string]time.Duration{}
		for _, kv := range strings.Split(v, ",") {
			name, d, _ := strings.Cut(kv, "=")
			w.timeouts[name], _ = time.ParseDuration(d)
		}
	}
	for _, st := range pod.Status.ContainerStatuses {
		name := serviceOf(st.Name)
		timeout, ok := w.timeouts[name]
		if !ok {
			continue
		}
		var why string
		switch {
		case st.State.Terminated != nil:
			why = "ended before it was ready: " + terminated(st.State.Terminated)
		case st.State.Running != nil && !st.Ready && timeout > 0 && now.Sub(st.State.Running.StartedAt.Time) >= timeout:
			why = fmt.Sprintf("did not become ready within its start timeout %s (%s)", timeout, probeOf(pod, st.Name))
		default:
			continue
		}
		return &executor.ServiceError{Service: name, Why: why, Tail: serviceTail(ctx, cs, pod.Namespace, pod.Name, st.Name)}
	}
	return nil
}

// probeOf says how container's readiness probe in pod tells it is ready.
func probeOf(pod *corev1.Pod, container string) string {
	for _, c := range pod.Spec.Containers {
		if c.Name != container || c.ReadinessProbe == nil {
			continue
		}
		h := c.ReadinessProbe.ProbeHandler
		switch {
		case h.TCPSocket != nil:
			return "tcp port " + h.TCPSocket.Port.String()
		case h.HTTPGet != nil:
			return "http GET :" + h.HTTPGet.Port.String() + h.HTTPGet.Path
		case h.Exec != nil:
			return fmt.Sprintf("command %q", h.Exec.Command[len(h.Exec.Command)-1])
		}
	}
	return "running"
}

// terminated says how a container ended.
func terminated(t *corev1.ContainerStateTerminated) string {
	s := fmt.Sprintf("exit %d", t.ExitCode)
	if t.Reason != "" {
		s += " (" + t.Reason + ")"
	}
	return s
}

// serviceTail is a service container's last log lines, or a line
// saying why they could not be read.
func serviceTail(ctx context.Context, cs *kubeclient.Clientset, ns, pod, container string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	b, err := podLog(cs, ns, pod, &corev1.PodLogOptions{Container: container, TailLines: ptr.To[int64](executor.ServiceTailLines)}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("(its log could not be read: %v)", err)
	}
	return string(b)
}

// WatchServices implements executor.ServiceRunner: it follows the run's
// pod until a service container has ended, or been restarted.
func (s *Session) WatchServices(ctx context.Context) error {
	for ctx.Err() == nil {
		err := s.watchServicesOnce(ctx)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

// watchServicesOnce reads the pod and follows it until a service ends
// (its error), the watch closes or fails (nil: the caller watches
// again), or ctx ends.
func (s *Session) watchServicesOnce(ctx context.Context) error {
	_, cs, _, err := s.ex.clients.get()
	if err != nil {
		return nil
	}
	pods := cs.CoreV1().Pods(s.ref.Namespace)
	pod, err := pods.Get(ctx, s.pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err != nil {
		// Gone: the steps say so (jobGone); a failed read is tried again.
		return nil
	}
	if err := s.serviceEnded(ctx, cs, pod); err != nil {
		return err
	}
	wt, err := pods.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", s.pod).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		return nil
	}
	defer wt.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-wt.ResultChan():
			if !ok || ev.Type == watch.Error || ev.Type == watch.Deleted {
				return nil
			}
			if p, ok := ev.Object.(*corev1.Pod); ok {
				if err := s.serviceEnded(ctx, cs, p); err != nil {
					return err
				}
			}
		}
	}
}

// serviceEnded is the error of a service container of pod that has
// ended, or restarted, while the run went on.
func (s *Session) serviceEnded(ctx context.Context, cs *kubeclient.Clientset, pod *corev1.Pod) error {
	for _, st := range pod.Status.ContainerStatuses {
		name := serviceOf(st.Name)
		if name == "" {
			continue
		}
		t := st.State.Terminated
		if t == nil {
			t = st.LastTerminationState.Terminated
		}
		if t == nil {
			continue
		}
		return &executor.ServiceError{Service: name, Why: "ended while the run went on: " + terminated(t), Tail: serviceTail(ctx, cs, pod.Namespace, pod.Name, st.Name)}
	}
	return nil
}

// ServiceLog implements executor.ServiceRunner: the service container's
// whole log.
func (s *Session) ServiceLog(ctx context.Context, name string, w io.Writer) error {
	_, cs, _, err := s.ex.clients.get()
	if err != nil {
		return err
	}
	rc, err := podLog(cs, s.ref.Namespace, s.pod, &corev1.PodLogOptions{Container: serviceContainer(name)}).Stream(ctx)
	if err != nil {
		return fmt.Errorf("read log of service %s: %w", name, err)
	}
	defer rc.Close()
	if _, err := io.Copy(w, rc); err != nil {
		return fmt.Errorf("read log of service %s: %w", name, err)
	}
	return nil
}

// podLog is the request for a container's log (pods/log, which the
// runner's Role grants get on).
func podLog(cs *kubeclient.Clientset, ns, pod string, opts *corev1.PodLogOptions) *rest.Request {
	return cs.CoreV1().RESTClient().Get().Namespace(ns).Resource("pods").Name(pod).SubResource("log").VersionedParams(opts, kubeclient.ParameterCodec)
}

var _ executor.ServiceRunner = (*Session)(nil)
