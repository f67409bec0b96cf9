// Package replicas is how the processes of one runner (one DID) on the
// Kubernetes executor know of each other: each holds a
// coordination.k8s.io Lease of its own, renewed every few seconds, and
// reads the others'. From the live ones it says which replica an event
// is for (rendezvous hashing over the live replicas' names) and whether
// a replica that drives a run is alive.
//
// Leases give speed, not safety: two replicas that briefly disagree on
// who is alive may both take an event, and the run's name (its Job,
// named from the run) fences the second start. What a Lease gives is
// that the survivors take up a dead replica's share of new work once
// its Lease expires, and a stopping replica's at once (it deletes its
// Lease).
package replicas

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeclient"
)

// Labels and annotations of a replica's Lease.
const (
	// LabelRole marks the runner's Leases of replicas (beside
	// executor.LabelRunner, the runner's digest).
	LabelRole = "knotless.dev/role"
	roleValue = "replica"
	// AnnotationReplica is the replica's name (the Lease's own name is a
	// digest of it); AnnotationInvocation the process holding it.
	AnnotationReplica    = "knotless.dev/replica"
	AnnotationInvocation = "knotless.dev/invocation"
)

// Defaults: a Lease lasts 15 s and is renewed every 2 s, as client-go's
// leader election's (15 s / 10 s / 2 s): a replica killed outright is
// taken for dead at most 15 s after its last renewal.
const (
	DefaultDuration = 15 * time.Second
	DefaultRenew    = 2 * time.Second
)

// ErrNameHeld is returned by Join when another live process holds the
// replica's name.
var ErrNameHeld = errors.New("replica name held by another live process")

// Config is one replica's place among the runner's.
type Config struct {
	// API returns the clientset and namespace to keep the Leases in
	// (the executor's: its credentials are refreshed under it).
	API func() (*kubeclient.Clientset, string, error)
	// Runner is the runner's DID; Name this replica's name, stable
	// across its restarts (a StatefulSet pod's, a host's); Invocation
	// this process (systemd's INVOCATION_ID, or pid and start).
	Runner, Name, Invocation string
	// Duration is how long a Lease lasts unrenewed; Renew how often
	// it is renewed and the others' read. 0 takes the defaults.
	Duration, Renew time.Duration
	Logger          *slog.Logger
	// Changed, if set, is called (from the renew loop) when the live
	// replicas change: the intake looks again at what is whose.
	Changed func()
}

// Member is a live replica.
type Member struct {
	Name       string    `json:"name"`
	Invocation string    `json:"invocation"`
	Renewed    time.Time `json:"renewed"`
	Self       bool      `json:"self,omitempty"`
}

// Set is this replica's view of the runner's replicas.
type Set struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	live    []Member  // by name
	renewed time.Time // this replica's last successful renewal
	// gone are the replicas that left the live ones, by their Lease's
	// last renewal: when a survivor claims a run, the takeover's time
	// counts from it.
	gone map[string]time.Time
}

// LeaseName is the name of the Lease of replica name of runner.
func LeaseName(runner, name string) string {
	d := sha256.Sum256([]byte(runner + "\n" + name))
	return "knotless-replica-" + hex.EncodeToString(d[:8])
}

// Join takes this replica's Lease: made if none is there, taken over
// once it expired (this name's earlier process's, waited out for up to
// the Lease's duration), and refused (ErrNameHeld, naming the holder)
// while another live process renews it. It then reads the others'. Run keeps it.
func Join(ctx context.Context, cfg Config) (*Set, error) {
	if cfg.Duration == 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Renew == 0 {
		cfg.Renew = DefaultRenew
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Set{cfg: cfg, log: cfg.Logger.With("component", "replicas", "replica", cfg.Name)}
	// A process of this name killed a moment ago (kill -9, a node
	// lost) left its Lease renewed: it is waited out. One that lives
	// goes on renewing it, and this process is refused.
	deadline := time.Now().Add(cfg.Duration + cfg.Renew)
	for waited := false; ; waited = true {
		err := s.renew(ctx, true)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNameHeld) || time.Now().After(deadline) {
			return nil, err
		}
		if !waited {
			s.log.Info("the replica's lease is held by another process; waiting for it to expire (an earlier process that died) or be renewed (one that lives)", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(cfg.Renew):
		}
	}
	if err := s.read(ctx); err != nil {
		return nil, err
	}
	s.log.Info("joined the runner's replicas", "live", s.names(), "lease", LeaseName(cfg.Runner, cfg.Name))
	return s, nil
}

// Run renews this replica's Lease and reads the others' every Renew,
// until ctx ends; then it deletes its Lease, so that the others take up
// its share at once rather than after the Lease's duration.
func (s *Set) Run(ctx context.Context) {
	tick := time.NewTicker(s.cfg.Renew)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.leave()
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.Renew*2)
		err := s.renew(rctx, false)
		if err == nil {
			err = s.read(rctx)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("replica lease not renewed; tried again", "err", err, "since_renewed", time.Since(s.lastRenewed()).Round(time.Millisecond))
		}
	}
}

func (s *Set) lastRenewed() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewed
}

// leave deletes this replica's Lease, if it still holds it.
func (s *Set) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cs, ns, err := s.cfg.API()
	if err == nil {
		leases := cs.CoordinationV1().Leases(ns)
		var l *coordinationv1.Lease
		l, err = leases.Get(ctx, LeaseName(s.cfg.Runner, s.cfg.Name), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			err = nil
		case err == nil && l.Annotations[AnnotationInvocation] == s.cfg.Invocation:
			uid, rv := l.UID, l.ResourceVersion
			err = leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
			if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
				err = nil
			}
		}
	}
	if err != nil {
		s.log.Warn("replica lease not given back; the others take up this replica's share when it expires", "err", err)
		return
	}
	s.log.Info("left the runner's replicas")
}

// renew makes, takes or renews this replica's Lease. first is Join's
// call: a Lease another live invocation renews is refused then; later,
// a Lease taken by another invocation means this process lost its name
// (it stalled past the duration and a new process of the name took
// it), and it is reported, not taken back.
func (s *Set) renew(ctx context.Context, first bool) error {
	cs, ns, err := s.cfg.API()
	if err != nil {
		return err
	}
	leases := cs.CoordinationV1().Leases(ns)
	name := LeaseName(s.cfg.Runner, s.cfg.Name)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(s.cfg.Duration / time.Second)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				Labels:      map[string]string{executor.LabelRunner: executor.RunnerLabel(s.cfg.Runner), LabelRole: roleValue},
				Annotations: map[string]string{AnnotationReplica: s.cfg.Name, AnnotationInvocation: s.cfg.Invocation}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &s.cfg.Name, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create replica lease %s/%s: %w", ns, name, err)
		}
		s.setRenewed(now.Time)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read replica lease %s/%s: %w", ns, name, err)
	}
	holder := l.Annotations[AnnotationInvocation]
	if holder != s.cfg.Invocation {
		if live(l, time.Now()) {
			if first {
				return fmt.Errorf("%w: replica %q of runner %s is held by invocation %s, renewed %s ago (lease %s/%s): give each replica its own --replica-name",
					ErrNameHeld, s.cfg.Name, s.cfg.Runner, holder, time.Since(renewTime(l)).Round(time.Second), ns, name)
			}
			return fmt.Errorf("replica lease %s/%s was taken by invocation %s", ns, name, holder)
		}
		if !first {
			return fmt.Errorf("replica lease %s/%s was taken by invocation %s and expired", ns, name, holder)
		}
		// An earlier process of this name died: take its Lease.
		l.Spec.AcquireTime = &now
		s.log.Info("took the lease of an earlier process of this replica", "invocation", holder)
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationReplica] = s.cfg.Name
	l.Annotations[AnnotationInvocation] = s.cfg.Invocation
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &s.cfg.Name, &secs, &now
	// The update carries the read resourceVersion: a concurrent taker
	// makes it fail rather than both holding the name.
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renew replica lease %s/%s: %w", ns, name, err)
	}
	s.setRenewed(now.Time)
	return nil
}

func (s *Set) setRenewed(t time.Time) {
	s.mu.Lock()
	s.renewed = t
	s.mu.Unlock()
}

// read lists the runner's replica Leases and keeps the live ones.
func (s *Set) read(ctx context.Context) error {
	cs, ns, err := s.cfg.API()
	if err != nil {
		return err
	}
	sel := labels.SelectorFromSet(labels.Set{executor.LabelRunner: executor.RunnerLabel(s.cfg.Runner), LabelRole: roleValue}).String()
	list, err := cs.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("list replica leases in %s: %w", ns, err)
	}
	now := time.Now()
	var members []Member
	for i := range list.Items {
		l := &list.Items[i]
		name := l.Annotations[AnnotationReplica]
		if name == "" || !live(l, now) {
			continue
		}
		members = append(members, Member{Name: name, Invocation: l.Annotations[AnnotationInvocation], Renewed: renewTime(l).UTC(), Self: name == s.cfg.Name})
	}
	sort.Slice(members, func(i, j int) bool { return members[i].Name < members[j].Name })
	s.mu.Lock()
	changed := !slices.EqualFunc(members, s.live, func(a, b Member) bool { return a.Name == b.Name && a.Invocation == b.Invocation })
	before := namesOf(s.live)
	for _, m := range s.live {
		if !slices.ContainsFunc(members, func(n Member) bool { return n.Name == m.Name }) {
			if s.gone == nil {
				s.gone = map[string]time.Time{}
			}
			s.gone[m.Name] = m.Renewed
		}
	}
	s.live = members
	s.mu.Unlock()
	if changed && before != nil {
		s.log.Info("the runner's live replicas changed", "live", namesOf(members), "before", before)
		if s.cfg.Changed != nil {
			s.cfg.Changed()
		}
	}
	return nil
}

func renewTime(l *coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime != nil {
		return l.Spec.RenewTime.Time
	}
	return l.CreationTimestamp.Time
}

// live reports whether a Lease was renewed within its duration. The
// renewal time is the holder's clock: replicas on several hosts need
// their clocks within a second or two of each other (NTP), or a
// replica is taken for dead early or late by the skew.
func live(l *coordinationv1.Lease, now time.Time) bool {
	d := DefaultDuration
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return now.Before(renewTime(l).Add(d))
}

func namesOf(ms []Member) []string {
	if ms == nil {
		return nil
	}
	names := make([]string, 0, len(ms))
	for _, m := range ms {
		names = append(names, m.Name)
	}
	return names
}

func (s *Set) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return namesOf(s.live)
}

// Self is this replica's name.
func (s *Set) Self() string { return s.cfg.Name }

// Members returns the live replicas, by name.
func (s *Set) Members() []Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.live)
}

// LastSeen is when replica name, no longer live, last renewed its
// Lease as this replica saw it (zero: not seen leave).
func (s *Set) LastSeen(name string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gone[name]
}

// Mine reports whether key (an event's) is this replica's to take: the
// live replica with the highest score for it (rendezvous hashing, so a
// replica's death moves only its own share). A replica whose own Lease
// has gone unrenewed past its duration takes nothing: the others may
// already have taken its share.
func (s *Set) Mine(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.renewed) >= s.cfg.Duration {
		return false
	}
	return Owner(namesOf(s.live), key) == s.cfg.Name
}

// Owner is the name among names with the highest score for key; "" for
// no names.
func Owner(names []string, key string) string {
	var best string
	var top uint64
	for _, n := range names {
		d := sha256.Sum256([]byte(n + "\n" + key))
		if v := binary.BigEndian.Uint64(d[:8]); best == "" || v > top {
			best, top = n, v
		}
	}
	return best
}
