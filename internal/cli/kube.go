package cli

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/kubernetes"
)

// KubeFlags configure the Kubernetes executor.
type KubeFlags struct {
	Kubeconfig      string            `help:"Kubeconfig file (default: $$KUBECONFIG, else the in-cluster service account, else ~/.kube/config). Re-read when it changes." placeholder:"FILE" group:"kubernetes"`
	Context         string            `help:"Kubeconfig context to use." group:"kubernetes"`
	Namespace       string            `help:"Namespace for run Jobs (default: the context's, else knotless-runs)." group:"kubernetes"`
	KubeQPS         float32           `help:"The runner's own limit on its requests to the API server: so many a second on average (client-go's token bucket; an exec stream counts as one)." default:"50" placeholder:"QPS" group:"kubernetes"`
	KubeBurst       int               `help:"The runner's own limit on its requests to the API server: so many at once above --kube-qps." default:"100" placeholder:"N" group:"kubernetes"`
	CPURequest      string            `help:"CPU request of a run pod when the workflow sets none." group:"kubernetes"`
	MemoryRequest   string            `help:"Memory request of a run pod when the workflow sets none." group:"kubernetes"`
	CPULimit        string            `help:"CPU limit of a run pod." group:"kubernetes"`
	MemoryLimit     string            `help:"Memory limit of a run pod." group:"kubernetes"`
	RuntimeClass    string            `help:"RuntimeClass of run pods (e.g. gvisor, kata)." group:"kubernetes"`
	NodeSelector    map[string]string `help:"Node selector of run pods, KEY=VALUE (repeatable)." placeholder:"KEY=VALUE" group:"kubernetes"`
	Toleration      []string          `help:"Toleration of run pods: KEY[=VALUE]:EFFECT (repeatable)." placeholder:"KEY[=VALUE]:EFFECT" group:"kubernetes"`
	ServiceAccount  string            `help:"Service account of run pods (its token is never mounted)." group:"kubernetes"`
	ImagePullSecret []string          `help:"Secret in the runs namespace with credentials to pull the run images PATTERN matches (repeatable): a glob as path.Match reads it (* stops at /) over the whole image reference as the workflow writes it. Only trusted runs (pushes) get it, unless ,untrusted follows the pattern. The operator makes the Secret; the runner never creates one." placeholder:"NAME=PATTERN[,untrusted]" sep:"none" group:"kubernetes"`
	ScheduleTimeout time.Duration     `help:"How long a run waits for a node (Pending is the scale-up signal)." default:"10m" group:"kubernetes"`
	AllowRootSteps  bool              `help:"Run steps as the image's user (root, mostly) instead of UID 1000, for images that need it. Such pods meet Pod Security baseline only: mint the kubeconfig with --pod-security baseline." group:"kubernetes"`
	Egress          string            `help:"What trusted runs' pods (pushes by the owner) may send out: open (as the cluster allows), public (DNS, and the public internet: no private, shared, loopback or link-local address, nor the API server, this host or --egress-block), deny (nothing), allow-dns (DNS only, never to the API server, link-local metadata, this host or --egress-block)." enum:"open,public,deny,allow-dns" default:"open" group:"kubernetes"`
	EgressUntrusted string            `help:"What untrusted runs' pods (pulls, merge-queue batches) may send out: a mode of --egress." enum:"open,public,deny,allow-dns" default:"public" group:"kubernetes"`
	EgressBlock     []string          `help:"With an egress mode allow-dns or public: a CIDR that pods may not reach either (repeatable); the API server, 169.254.0.0/16 and this host's addresses always are." placeholder:"CIDR" group:"kubernetes"`
}

func (f *KubeFlags) executorDef() executorDef {
	return executorDef{
		Name:    kubernetes.Name,
		Aliases: []string{"kube"},
		What:    "a Job per run",
		Dirs:    executor.PodDirs(),
		New: func(env *Env, o executorOptions) (executor.Executor, error) {
			return f.newKubernetes(env, o)
		},
		DryRun: func(env *Env, o executorOptions, spec executor.Spec, secrets map[string]string) error {
			return f.printManifests(env, o.Image, spec, secrets)
		},
		Stopper: func(env *Env, o executorOptions) (executor.Stopper, error) {
			return f.stopper(env, o.Runner, o.Logger)
		},
	}
}

// stopper builds the Kubernetes executor from the credential flags
// alone (--kubeconfig, $KUBECONFIG, the in-cluster service account,
// ~/.kube/config; --context): stopping a Job by its Ref needs no pod
// options, and so none of what they need (this host's addresses).
func (f *KubeFlags) stopper(env *Env, runner string, log *slog.Logger) (*kubernetes.Executor, error) {
	if err := f.rateLimit(); err != nil {
		return nil, err
	}
	return kubernetes.New(kubernetes.Config{
		Credentials: kubernetes.Credentials{
			Kubeconfig:    f.Kubeconfig,
			KubeconfigEnv: env.Getenv("KUBECONFIG"),
			Home:          env.Getenv("HOME"),
			Context:       f.Context,
			Namespace:     f.Namespace,
		},
		Runner: runner,
		QPS:    f.KubeQPS,
		Burst:  f.KubeBurst,
		Logger: log,
	})
}

// rateLimit checks --kube-qps and --kube-burst: a limit, not none (a
// negative QPS turns client-go's off).
func (f *KubeFlags) rateLimit() error {
	if !(f.KubeQPS > 0) || math.IsInf(float64(f.KubeQPS), 0) {
		return usageError{fmt.Errorf("--kube-qps %g: want a number of requests a second above 0", f.KubeQPS)}
	}
	if f.KubeBurst < 1 {
		return usageError{fmt.Errorf("--kube-burst %d: want 1 or more", f.KubeBurst)}
	}
	return nil
}

// newKubernetes builds the Kubernetes executor from the flags.
func (f *KubeFlags) newKubernetes(env *Env, o executorOptions) (*kubernetes.Executor, error) {
	if err := f.rateLimit(); err != nil {
		return nil, err
	}
	pod, err := f.podOptions(o.Image)
	if err != nil {
		return nil, err
	}
	pod.DefaultClass, _ = o.Classes.Pick("", true)
	ex, err := kubernetes.New(kubernetes.Config{
		Credentials: kubernetes.Credentials{
			Kubeconfig:    f.Kubeconfig,
			KubeconfigEnv: env.Getenv("KUBECONFIG"),
			Home:          env.Getenv("HOME"),
			Context:       f.Context,
			Namespace:     f.Namespace,
		},
		Runner:           o.Runner,
		Driver:           o.Driver,
		DriverInvocation: o.DriverInvocation,
		Pod:              pod,
		ScheduleTimeout:  f.ScheduleTimeout,
		QPS:              f.KubeQPS,
		Burst:            f.KubeBurst,
		Logger:           o.Logger,
		Observer:         o.Observer,
	})
	if err != nil {
		return nil, fmt.Errorf("--executor kubernetes: %w", err)
	}
	return ex, nil
}

// podOptions are the flags' settings for run pods.
func (f *KubeFlags) podOptions(image string) (kubernetes.PodOptions, error) {
	tolerations, err := parseTolerations(f.Toleration)
	if err != nil {
		return kubernetes.PodOptions{}, err
	}
	var pullSecrets []kubernetes.PullSecret
	for _, s := range f.ImagePullSecret {
		ps, err := kubernetes.ParsePullSecret(s)
		if err != nil {
			return kubernetes.PodOptions{}, usageError{fmt.Errorf("--image-pull-secret %q: %w", s, err)}
		}
		pullSecrets = append(pullSecrets, ps)
	}
	egress, err := f.egress()
	if err != nil {
		return kubernetes.PodOptions{}, err
	}
	return kubernetes.PodOptions{
		Image:            image,
		CPURequest:       f.CPURequest,
		MemoryRequest:    f.MemoryRequest,
		CPULimit:         f.CPULimit,
		MemoryLimit:      f.MemoryLimit,
		RuntimeClass:     f.RuntimeClass,
		NodeSelector:     f.NodeSelector,
		Tolerations:      tolerations,
		ServiceAccount:   f.ServiceAccount,
		ImagePullSecrets: pullSecrets,
		Egress:           egress,
		AllowRoot:        f.AllowRootSteps,
	}, nil
}

// egress reads --egress, --egress-untrusted and --egress-block. When
// a mode has a block list (allow-dns, public) this host's own addresses
// join it: a run pod must not reach the runner. Reading them needs
// AF_NETLINK; a failure stops the start rather than leave them out.
func (f *KubeFlags) egress() (kubernetes.Egress, error) {
	mode, err := kubernetes.ParseEgressMode(f.Egress)
	if err != nil {
		return kubernetes.Egress{}, usageError{fmt.Errorf("--egress: %w", err)}
	}
	untrusted, err := kubernetes.ParseEgressMode(f.EgressUntrusted)
	if err != nil {
		return kubernetes.Egress{}, usageError{fmt.Errorf("--egress-untrusted: %w", err)}
	}
	eg := kubernetes.Egress{Mode: mode, Untrusted: untrusted}
	for _, s := range f.EgressBlock {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return kubernetes.Egress{}, usageError{fmt.Errorf("--egress-block %q: want a CIDR or an address", s)}
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		eg.Block = append(eg.Block, p)
	}
	for _, m := range []struct {
		flag string
		mode kubernetes.EgressMode
	}{{"--egress", eg.For(true)}, {"--egress-untrusted", eg.For(false)}} {
		if m.mode != kubernetes.EgressAllowDNS && m.mode != kubernetes.EgressPublic {
			continue
		}
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return kubernetes.Egress{}, fmt.Errorf("%s %s: this host's addresses, which run pods must not reach: %w", m.flag, m.mode, err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					eg.Block = append(eg.Block, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
				}
			}
		}
		break
	}
	return eg, nil
}

// parseTolerations reads KEY[=VALUE]:EFFECT.
func parseTolerations(specs []string) ([]corev1.Toleration, error) {
	var out []corev1.Toleration
	for _, s := range specs {
		kv, effect, ok := strings.Cut(s, ":")
		if !ok || kv == "" {
			return nil, usageError{fmt.Errorf("--toleration %q: want KEY[=VALUE]:EFFECT", s)}
		}
		t := corev1.Toleration{Effect: corev1.TaintEffect(effect), Operator: corev1.TolerationOpExists}
		switch t.Effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute, "":
		default:
			return nil, usageError{fmt.Errorf("--toleration %q: effect must be NoSchedule, PreferNoSchedule or NoExecute", s)}
		}
		if k, v, hasValue := strings.Cut(kv, "="); hasValue {
			t.Key, t.Value, t.Operator = k, v, corev1.TolerationOpEqual
		} else {
			t.Key = kv
		}
		out = append(out, t)
	}
	return out, nil
}
