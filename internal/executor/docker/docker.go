// Package docker is the executor that runs each workflow run in one
// long-lived container on a Docker daemon, driven in-process through the
// Engine API. It is the explicit fallback for a host without a cluster.
//
// A run gets a container, a bridge network and three volumes (/work,
// /steps, /outputs) and one per absolute cache directory, all labelled with the runner and the run so that
// Sweep finds them again after a crash. A step is an exec of `sh -s` with
// its payload on the exec's stdin; every process it leaves behind is
// killed when it ends. docs/design/docker.md tells the whole design.
package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"github.com/moby/moby/client/pkg/versions"
	"k8s.io/apimachinery/pkg/api/resource"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/tarstream"
	"knotless.dev/run/internal/rules/class"
)

// Name is the executor's name.
const Name = "docker"

// Label keys on every container, network and volume a run makes.
const (
	// LabelRunner holds executor.RunnerLabel of the runner's DID.
	LabelRunner = executor.LabelRunner
	// LabelRun holds the run id.
	LabelRun = executor.LabelRun
	// LabelDir tells which of the run's directories a volume holds.
	LabelDir = "dev.knotless.dir"
)

// Network choices besides a network's name.
const (
	// NetworkPerRun (the default) creates a bridge network for each run,
	// so that one run's container cannot reach another's.
	NetworkPerRun = ""
	// NetworkNone gives the container no network at all.
	NetworkNone = "none"
)

// PullPolicy says when Start pulls the run's image.
type PullPolicy string

// The pull policies.
const (
	PullMissing PullPolicy = "missing" // pull only an image the daemon lacks (the default)
	PullNever   PullPolicy = "never"   // never pull: the image must be there
	PullAlways  PullPolicy = "always"  // pull before every run
)

// DefaultCapabilities are the only capabilities a run's container keeps
// (all others are dropped): what root in a build container needs to own,
// chmod and write its files, drop to another user, kill its own
// processes and bind a low port. docs/design/docker.md says why each.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_NET_BIND_SERVICE",
}

// DefaultPidsLimit bounds the processes of one run.
const DefaultPidsLimit = 4096

// Config configures the docker executor.
type Config struct {
	// Host is the daemon's address, as DOCKER_HOST spells it
	// (unix:///var/run/docker.sock when empty).
	Host string
	// Network is NetworkPerRun, NetworkNone or the name of an existing
	// network that every run joins (then runs can reach each other).
	Network string
	// CPU and Memory are a run's limits when its workflow asks for none,
	// as quantities ("2", "500m"; "4Gi"); empty means no limit.
	CPU, Memory string
	// PidsLimit bounds a run's processes; 0 means DefaultPidsLimit.
	PidsLimit int64
	// Capabilities replaces DefaultCapabilities when not nil.
	Capabilities []string
	// Pull is the pull policy; empty means PullMissing.
	Pull PullPolicy
	// Runner is the runner's DID: Sweep removes only its runs.
	Runner string
	// Concurrency is how many runs may go at once (0 as 1). Above one,
	// a run's container may be there while another run's network is
	// made: on an engine with isolationGap the first Start warns.
	Concurrency int
	// Limits bound every transfer in and out of a container.
	Limits tarstream.Limits
	// Logger takes the executor's lines as the caller tagged it
	// (component, executor); the executor adds only the run.
	Logger *slog.Logger
	// Observer is told of sessions ready, transfers, sweeps and cleanup
	// failures; nil observes nothing.
	Observer executor.Observer
}

// Executor runs sessions as containers on one Docker daemon.
type Executor struct {
	cfg    Config
	cli    *client.Client
	raw    *http.Client // for the few answers the client flattens
	cpu    int64        // default NanoCPUs
	memory int64        // default bytes
	log    *slog.Logger
	obs    executor.Observer

	swept           atomic.Int64 // runs of earlier processes removed by Sweep
	cleanupFailures atomic.Int64 // runs whose objects could not all be removed

	isolationChecked sync.Once // the engine's network isolation judged, at the first Start
	diskWarned       sync.Once // said, at the first Start with a disk bound, that it is not applied
}

// New returns a docker executor for the daemon at cfg.Host. It does not
// contact the daemon: Start does, and says when it cannot.
func New(cfg Config) (*Executor, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.PidsLimit == 0 {
		cfg.PidsLimit = DefaultPidsLimit
	}
	if cfg.Observer == nil {
		cfg.Observer = executor.NoObserver{}
	}
	if cfg.Capabilities == nil {
		cfg.Capabilities = DefaultCapabilities
	}
	switch cfg.Pull {
	case "":
		cfg.Pull = PullMissing
	case PullMissing, PullNever, PullAlways:
	default:
		return nil, fmt.Errorf("docker pull policy %q: want missing, never or always", cfg.Pull)
	}
	cpu, err := parseCPU(cfg.CPU)
	if err != nil {
		return nil, fmt.Errorf("docker default cpu: %w", err)
	}
	memory, err := parseMemory(cfg.Memory)
	if err != nil {
		return nil, fmt.Errorf("docker default memory: %w", err)
	}
	var opts []client.Opt // API-version negotiation is the default
	if cfg.Host != "" {
		opts = append(opts, client.WithHost(cfg.Host))
	}
	cli, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client for %q: %w", cfg.Host, err)
	}
	dial := cli.Dialer()
	raw := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
	}}
	// The caller tags the logger (the command line: component=executor
	// executor=docker); a second component here would repeat the key.
	return &Executor{cfg: cfg, cli: cli, raw: raw, cpu: cpu, memory: memory, log: cfg.Logger, obs: cfg.Observer}, nil
}

// Name implements executor.Executor.
func (e *Executor) Name() string { return Name }

// Close releases the executor's connections to the daemon.
func (e *Executor) Close() error {
	e.raw.CloseIdleConnections()
	return e.cli.Close()
}

var validRunID = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// names are the objects of one run.
type names struct {
	container, network string
	beside             []string          // the ids of the containers beside the run's (its steps' own, its services')
	volumes            map[string]string // by directory: work, steps, outputs, cache-N
}

func runNames(runner, run string) names {
	base := "knotless-" + runner + "-" + run
	return names{
		container: base,
		network:   base,
		volumes:   map[string]string{"work": base + "-work", "steps": base + "-steps", "outputs": base + "-outputs"},
	}
}

// daemonError names the daemon in an error that says it cannot be
// reached, so that a run's error tells the cause.
func (e *Executor) daemonError(err error) error {
	var op *net.OpError
	if client.IsErrConnectionFailed(err) || errors.As(err, &op) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("docker daemon at %s is not reachable: %w", e.cli.DaemonHost(), err)
	}
	return err
}

// isolatedFromAPI is the Engine API version of Docker 28.0, the first
// engine whose bridge driver sets the FORWARD chain's jumps to its
// isolation chains once, as the daemon starts, rather than again for
// each network it creates.
const isolatedFromAPI = "1.48"

// isolationGap reports whether an engine of Engine API version
// apiVersion leaves its bridge networks open to each other for a moment
// each time it creates a network. Before Docker 28 every network create
// deletes the FORWARD chain's jump to DOCKER-ISOLATION-STAGE-1 and
// inserts it again, and in between the per-network "from this bridge
// to anywhere" rule accepts a connection from one run's container to
// another's, and what the two send before the jump is back.
func isolationGap(apiVersion string) bool {
	return versions.LessThan(apiVersion, isolatedFromAPI)
}

// checkIsolation warns once, at the first Start, when runs that may go
// at once get networks of their own from an engine with the isolation
// gap. One run at a time is not exposed: a run's network is made before
// its container, and no other run's container is there (unless one
// outlived its run: a clean-up that failed leaves it to the sweep).
func (e *Executor) checkIsolation(apiVersion string) {
	if e.cfg.Network != NetworkPerRun || e.cfg.Concurrency < 2 {
		return
	}
	e.isolationChecked.Do(func() {
		if isolationGap(apiVersion) {
			e.log.Warn("runs' networks are open to each other whenever this docker engine creates a network",
				"engine_api", apiVersion, "concurrency", e.cfg.Concurrency,
				"why", "engines before Docker 28 (API "+isolatedFromAPI+") delete and re-insert the jump to DOCKER-ISOLATION-STAGE-1 at each network create; a run can connect to another run's container in that moment",
				"fix", "Docker 28 or later, --concurrency 1, or --network none")
		}
	})
}

// warnDiskUnbounded says once, at the first Start of a run whose class
// bounds the disk (every class does: a class without ephemeral-storage
// has the default class's), that the Docker executor does not apply the
// bound. Docker bounds a container's writable layer (--storage-opt
// size) only on some storage drivers (overlay2 only over xfs mounted
// with pquota) and its volumes, where the checkout and the steps'
// files are, not at all; a class that sets ephemeral-storage itself is
// refused at start (cli).
func (e *Executor) warnDiskUnbounded(cls class.Class) {
	if cls.EphemeralStorage == "" {
		return
	}
	e.diskWarned.Do(func() {
		e.log.Warn("runs' disk is not bounded on the docker executor: the class's ephemeral-storage is not applied",
			"class", cls.Name, "ephemeral_storage", cls.EphemeralStorage,
			"why", "docker bounds a container's writable layer only on some storage drivers (overlay2 over xfs with pquota) and its volumes not at all",
			"fix", "the kubernetes executor, or a data root on a disk of its own")
	})
}

// Start creates the run's network, volumes and container, starts the
// container, and returns when steps can run in it. Whatever it made is
// removed again when it fails.
func (e *Executor) Start(ctx context.Context, spec executor.Spec) (executor.Session, error) {
	if !validRunID.MatchString(spec.RunID) {
		return nil, fmt.Errorf("run id %q cannot name a docker object", spec.RunID)
	}
	runner := executor.RunnerLabel(spec.Runner)
	n := runNames(runner, spec.RunID)
	log := e.log.With("run", spec.RunID)
	ping, err := e.cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	if err != nil {
		return nil, e.daemonError(fmt.Errorf("ping docker daemon: %w", err))
	}
	e.checkIsolation(ping.APIVersion)
	if err := e.fence(ctx, n.container); err != nil {
		return nil, err
	}
	if err := e.ensureImage(ctx, spec.Image, log); err != nil {
		return nil, err
	}
	e.warnDiskUnbounded(spec.Class)
	res, err := e.resources(spec.Resources, spec.Class)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{}
	for k, v := range spec.Annotations {
		labels[k] = v
	}
	labels[LabelRunner], labels[LabelRun] = runner, spec.RunID

	s := &Session{
		ex:    e,
		ref:   executor.Ref{Executor: Name, RunID: spec.RunID, Name: n.container},
		names: n,
		keep:  spec.Keep,
		log:   log,
		steps: map[string]*step{},
		quit:  make(chan struct{}),
	}
	createdAt := time.Now()
	if err := s.create(ctx, spec, labels, res); err != nil {
		// What was made of the run goes.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if rerr := s.remove(cctx); rerr != nil {
			e.cleanupFailed(log, "remove run after failed start", rerr)
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	ready := time.Since(createdAt)
	e.obs.SessionReady(ready)
	log.Info("container started", "container", n.container, "image", spec.Image, "after", ready.Round(time.Millisecond))
	return s, nil
}

// fence refuses a run whose container is there already: its objects
// are named from its id (run.IDFor), so some process drives it (or an
// earlier one's are not removed yet). Nothing is made, and nothing
// removed: the objects are the other's. Two Starts of one run at the
// same moment are not told apart here; one process owns a state
// directory, and its queue holds a run once.
func (e *Executor) fence(ctx context.Context, name string) error {
	in, err := e.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		return nil
	case err != nil:
		return e.daemonError(fmt.Errorf("inspect container %s: %w", name, err))
	}
	e.obs.FenceConflict()
	e.log.Warn("the run's container exists already: another process drives this run; not run twice", "container", name, "id", in.Container.ID)
	return fmt.Errorf("container %s: %w (id %s)", name, executor.ErrRunExists, in.Container.ID)
}

// create makes the run's objects, each labelled with labels: its
// network (with --docker-network per-run), its volumes and its
// container, started. What it made is the caller's to remove when it
// fails.
func (s *Session) create(ctx context.Context, spec executor.Spec, labels map[string]string, res container.Resources) error {
	netMode, err := s.createNetwork(ctx, labels)
	if err != nil {
		return err
	}
	mounts, err := s.createVolumes(ctx, spec.Caches, labels)
	if err != nil {
		return err
	}
	if err := s.startContainer(ctx, spec.Image, netMode, mounts, labels, res); err != nil {
		return err
	}
	if err := s.startStepContainers(ctx, spec, mounts, labels, res); err != nil {
		return err
	}
	return s.startServices(ctx, spec, labels, res)
}

// createNetwork makes the run's own network when the executor gives
// each run one, and returns the network mode of its container.
func (s *Session) createNetwork(ctx context.Context, labels map[string]string) (container.NetworkMode, error) {
	e, n := s.ex, s.names
	netMode := container.NetworkMode(e.cfg.Network)
	if e.cfg.Network == NetworkPerRun {
		nw, err := e.cli.NetworkCreate(ctx, n.network, client.NetworkCreateOptions{
			Driver: "bridge",
			Labels: labels,
		})
		if err != nil {
			return "", e.daemonError(fmt.Errorf("create network %s: %w", n.network, err))
		}
		s.netID = nw.ID
		netMode = container.NetworkMode(nw.ID)
	}
	return netMode, nil
}

// createVolumes makes the run's volumes, its directories' and one per
// cache directory, and returns their mounts.
func (s *Session) createVolumes(ctx context.Context, caches []string, labels map[string]string) ([]mount.Mount, error) {
	n := s.names
	var mounts []mount.Mount
	for _, dir := range []string{"work", "steps", "outputs"} {
		m, err := s.createVolume(ctx, dir, "/"+dir, labels)
		if err != nil {
			return nil, err
		}
		mounts = append(mounts, m)
	}
	// A volume per cache directory: the image may not have the path, and
	// its file system stays the image's.
	for i, dir := range caches {
		key := "cache-" + strconv.Itoa(i)
		n.volumes[key] = n.container + "-" + key
		m, err := s.createVolume(ctx, key, dir, labels)
		if err != nil {
			return nil, err
		}
		mounts = append(mounts, m)
	}
	return mounts, nil
}

// startContainer creates the run's container of image and starts it,
// and sees it running: an image without sh and sleep exits at once.
func (s *Session) startContainer(ctx context.Context, image string, netMode container.NetworkMode, mounts []mount.Mount, labels map[string]string, res container.Resources) error {
	e, n := s.ex, s.names
	yes := true
	if res.PidsLimit == nil {
		pids := e.cfg.PidsLimit
		res.PidsLimit = &pids
	}
	created, err := e.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: n.container,
		Config: &container.Config{
			Image:      image,
			Entrypoint: []string{"sh", "-c", keepAlive},
			Cmd:        []string{},
			WorkingDir: "/work",
			Labels:     labels,
			StopSignal: "SIGTERM",
		},
		HostConfig: &container.HostConfig{
			NetworkMode:  netMode,
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
		return e.daemonError(fmt.Errorf("create container %s: %w", n.container, err))
	}
	s.id = created.ID
	if _, err := e.cli.ContainerStart(ctx, s.id, client.ContainerStartOptions{}); err != nil {
		return e.daemonError(fmt.Errorf("start container %s: %w", n.container, err))
	}
	in, err := e.cli.ContainerInspect(ctx, s.id, client.ContainerInspectOptions{})
	if err != nil {
		return e.daemonError(fmt.Errorf("inspect container %s: %w", n.container, err))
	}
	if st := in.Container.State; st == nil || !st.Running {
		code := -1
		if st != nil {
			code = st.ExitCode
		}
		return fmt.Errorf("container %s of image %s exited at once with code %d: the image needs a POSIX sh and sleep", n.container, image, code)
	}
	return nil
}

// createVolume creates the run's volume of key (a directory: work,
// steps, outputs, cache-N), labelled with labels and the key, and
// returns its mount at target.
func (s *Session) createVolume(ctx context.Context, key, target string, labels map[string]string) (mount.Mount, error) {
	name := s.names.volumes[key]
	vl := map[string]string{LabelDir: key}
	for k, v := range labels {
		vl[k] = v
	}
	if _, err := s.ex.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: name, Driver: "local", Labels: vl}); err != nil {
		return mount.Mount{}, s.ex.daemonError(fmt.Errorf("create volume %s: %w", name, err))
	}
	return mount.Mount{
		Type: mount.TypeVolume, Source: name, Target: target,
		VolumeOptions: &mount.VolumeOptions{NoCopy: true},
	}, nil
}

// keepAlive is the container's main process: it idles until stopped, in
// any image with a POSIX sh and sleep.
const keepAlive = `trap "exit 0" TERM; while :; do sleep 3600 & wait; done`

// ensureImage makes the image present according to the pull policy.
func (e *Executor) ensureImage(ctx context.Context, image string, log *slog.Logger) error {
	if present, err := e.imagePresent(ctx, image); present || err != nil {
		return err
	}
	log.Info("pulling image", "image", image)
	resp, err := e.cli.ImagePull(ctx, image, client.ImagePullOptions{})
	if err == nil {
		err = resp.Wait(ctx)
	}
	if err != nil {
		return e.daemonError(fmt.Errorf("image %s is not on the docker daemon and cannot be pulled: %w", image, err))
	}
	return nil
}

// CheckImage implements executor.ImageChecker: a run of image can
// start when the image is on the daemon, or, unless the pull policy is
// never, when its registry serves it (the daemon reads its manifest
// from the registry, without the daemon's credentials, as a pull does;
// no layer is pulled).
func (e *Executor) CheckImage(ctx context.Context, image string) error {
	if present, err := e.imagePresent(ctx, image); present || err != nil {
		return err
	}
	if _, err := e.cli.DistributionInspect(ctx, image, client.DistributionInspectOptions{}); err != nil {
		return e.daemonError(fmt.Errorf("image %s is not on the docker daemon and its registry does not serve it: %w", image, err))
	}
	return nil
}

// imagePresent says whether a run of image can use the daemon's copy
// (false under the pull policy always: it pulls each time), and fails
// when the image is named nowhere or the policy is never and there is
// no copy.
func (e *Executor) imagePresent(ctx context.Context, image string) (bool, error) {
	if image == "" {
		return false, errors.New("no image: the workflow names none and the runner has no default image")
	}
	if e.cfg.Pull == PullAlways {
		return false, nil
	}
	_, err := e.cli.ImageInspect(ctx, image)
	switch {
	case err == nil:
		return true, nil
	case !cerrdefs.IsNotFound(err):
		return false, e.daemonError(fmt.Errorf("inspect image %s: %w", image, err))
	case e.cfg.Pull == PullNever:
		return false, fmt.Errorf("image %s is not on the docker daemon and the pull policy is never", image)
	}
	return false, nil
}

// resources turns a run's requests (clamped to its class by the
// engine), else its class's bounds, else the configured defaults, into
// container limits; the class's pids bound over the configured one. A
// class's ephemeral storage is not applied: the container's writable
// layer has no size bound on most storage drivers.
func (e *Executor) resources(r executor.Resources, cls class.Class) (container.Resources, error) {
	cpu, memory := e.cpu, e.memory
	if r.CPU == "" {
		r.CPU = cls.CPU
	}
	if r.Memory == "" {
		r.Memory = cls.Memory
	}
	if r.CPU != "" {
		v, err := parseCPU(r.CPU)
		if err != nil {
			return container.Resources{}, fmt.Errorf("resources.cpu: %w", err)
		}
		cpu = v
	}
	if r.Memory != "" {
		v, err := parseMemory(r.Memory)
		if err != nil {
			return container.Resources{}, fmt.Errorf("resources.memory: %w", err)
		}
		memory = v
	}
	res := container.Resources{NanoCPUs: cpu, Memory: memory}
	if cls.Pids > 0 {
		res.PidsLimit = &cls.Pids
	}
	if memory > 0 {
		res.MemorySwap = memory // no swap beyond the limit
	}
	return res, nil
}

func parseCPU(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 {
		return 0, fmt.Errorf("%q is not a positive quantity", s)
	}
	return q.MilliValue() * 1_000_000, nil
}

func parseMemory(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 {
		return 0, fmt.Errorf("%q is not a positive quantity", s)
	}
	// The kernel refuses a memory limit below a few MiB.
	if q.Value() < 6<<20 {
		return 0, fmt.Errorf("%q is less than 6Mi", s)
	}
	return q.Value(), nil
}

// Sweep removes the containers, networks and volumes of the configured
// runner whose run is not in keep, and returns one ref per run removed.
// It finds them by the runner label of this build and by the 16-digit
// one that builds before the executors shared executor.RunnerLabel
// wrote, so an upgrade leaves no run of the same runner behind.
func (e *Executor) Sweep(ctx context.Context, keep []string) (swept []executor.Ref, err error) {
	start := time.Now()
	defer func() { e.obs.Swept(len(swept), err) }()
	if e.cfg.Runner == "" {
		return nil, errors.New("docker sweep: the executor has no runner DID configured")
	}
	runner := executor.RunnerLabel(e.cfg.Runner)
	kept := map[string]bool{}
	for _, id := range keep {
		kept[id] = true
	}
	runs := map[string]*names{}
	labelOf := map[string]string{} // run id -> its runner label value
	for _, value := range []string{runner, legacyRunnerLabel(runner)} {
		if err := e.findRuns(ctx, value, kept, runs, labelOf); err != nil {
			return nil, err
		}
	}
	ids := make([]string, 0, len(runs))
	for id := range runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var errs []error
	for _, id := range ids {
		r := runs[id]
		s := &Session{ex: e, id: r.container, netID: r.network, names: *r}
		if err := s.remove(ctx); err != nil {
			e.cleanupFailed(e.log.With("run", id), "orphan not swept", err)
			errs = append(errs, fmt.Errorf("sweep run %s: %w", id, err))
			continue
		}
		e.swept.Add(1)
		e.log.Info("swept run", "run", id, "container", r.container != "", "network", r.network != "", "volumes", len(r.volumes),
			"swept_total", e.swept.Load())
		swept = append(swept, executor.Ref{Executor: Name, RunID: id, Name: runNames(labelOf[id], id).container})
	}
	e.log.Info("sweep finished", "swept", len(swept), "failed", len(errs), "kept_runs", len(keep),
		"duration", time.Since(start).Round(time.Millisecond), "swept_total", e.swept.Load(), "cleanup_failures_total", e.cleanupFailures.Load())
	return swept, errors.Join(errs...)
}

// cleanupFailed counts and logs a run whose objects could not all be
// removed.
func (e *Executor) cleanupFailed(log *slog.Logger, msg string, err error) {
	e.cleanupFailures.Add(1)
	e.obs.CleanupFailed()
	log.Error(msg, "err", err, "cleanup_failures_total", e.cleanupFailures.Load())
}

// legacyRunnerLabel is the runner label that builds before
// executor.RunnerLabel wrote on Docker objects: its first 16 hex digits.
func legacyRunnerLabel(runner string) string { return runner[:16] }

// findRuns adds to runs the containers, networks and volumes labelled
// with runner label value whose run is not kept.
func (e *Executor) findRuns(ctx context.Context, value string, kept map[string]bool, runs map[string]*names, labelOf map[string]string) error {
	filter := client.Filters{}.Add("label", LabelRunner+"="+value)
	found := func(run string) *names {
		if runs[run] == nil {
			runs[run] = &names{volumes: map[string]string{}}
			labelOf[run] = value
		}
		return runs[run]
	}
	cs, err := e.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: filter})
	if err != nil {
		return e.daemonError(fmt.Errorf("sweep: list containers: %w", err))
	}
	for _, c := range cs.Items {
		run := c.Labels[LabelRun]
		switch {
		case run == "" || kept[run]:
		case c.Labels[LabelService] != "" || c.Labels[LabelStep] != "":
			found(run).beside = append(found(run).beside, c.ID)
		default:
			found(run).container = c.ID
		}
	}
	ns, err := e.cli.NetworkList(ctx, client.NetworkListOptions{Filters: filter})
	if err != nil {
		return e.daemonError(fmt.Errorf("sweep: list networks: %w", err))
	}
	for _, nw := range ns.Items {
		if run := nw.Labels[LabelRun]; run != "" && !kept[run] {
			found(run).network = nw.ID
		}
	}
	vs, err := e.cli.VolumeList(ctx, client.VolumeListOptions{Filters: filter})
	if err != nil {
		return e.daemonError(fmt.Errorf("sweep: list volumes: %w", err))
	}
	for _, v := range vs.Items {
		if run := v.Labels[LabelRun]; run != "" && !kept[run] {
			found(run).volumes[v.Name] = v.Name
		}
	}
	return nil
}

// drain reads r to its end and closes it.
func drain(r io.ReadCloser) {
	_, _ = io.Copy(io.Discard, r)
	_ = r.Close()
}
