package kubernetes

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/spool"
	"knotless.dev/run/internal/kube/kubeexec"
	"knotless.dev/run/internal/lib/tarstream"
)

// reattach bounds how a step's stream is picked up again after it drops:
// about 90 s in all, which covers the pod garbage collector's up to 80 s
// to mark the pod of a deleted Node (its quarantine of 40 s, checked
// every 20 s), so that a runner that may not read Nodes still names a
// lost node.
const (
	reattachAttempts = 10
	reattachFirst    = 500 * time.Millisecond
	reattachMax      = 15 * time.Second
	deleteWait       = 2 * time.Minute
	// podReplayWait bounds replaying the changes of a pod found deleted.
	podReplayWait = 2 * time.Second
)

// Session is one run's Job and pod.
type Session struct {
	ex  *Executor
	ref executor.Ref
	uid types.UID
	pod string
	// podUID is the pod's UID: the kubelet's events name it, also
	// after the pod is deleted.
	podUID types.UID
	node   string // where the pod was scheduled
	keep   bool
	// log names the run, the Job, its namespace and image, and (once
	// the pod is Ready) the pod and its node.
	log *slog.Logger

	mu      sync.Mutex
	steps   map[string]*step
	wg      sync.WaitGroup // the step pumps
	stopped bool
	// pumpCtx is the pumps' lifetime: it ends with Stop, not with the
	// call that started a step.
	pumpCtx context.Context //nolint:containedctx // owned by the session's goroutines
	cancel  context.CancelFunc

	// lastStep is the step this process started last, emptyAfter the
	// last whose exit line said the outputs directory was empty (under
	// mu): while they are the same step, Get of the outputs needs no
	// exec.
	lastStep, emptyAfter string

	// stepContainers names the container of each step with an image of
	// its own (AnnotationStepContainers); any other runs in the run
	// container.
	stepContainers map[string]string

	lostNode   string // the node a step found gone (under mu)
	podVersion string // resource version of the pod last seen (under mu)

	// deleteMu serialises Stop's deletions; deleted says one succeeded,
	// so a Stop after a failed one tries again.
	deleteMu sync.Mutex
	deleted  bool
}

// step is one step's output as received, and how it ended.
type step struct {
	out  *spool.Spool
	done chan struct{} // closed when exit and err are final
	once sync.Once
	exit executor.Exit
	err  error
	// since is when this process started the step, or began following
	// it (followed: another process started it).
	since    time.Time
	followed bool
	released bool // the pump ended with the session (Release, Stop), the step going on
	// ended is told how the step ended, once.
	ended func(exit executor.Exit, err error)
}

// settle records how the step ended, once: when the runner acknowledges
// the exit line (the exec is still closing then) or when its pump gives up.
func (st *step) settle(exit executor.Exit, err error) {
	st.once.Do(func() {
		st.exit, st.err = exit, err
		_ = st.out.Close()
		close(st.done)
		if st.ended != nil {
			st.ended(exit, err)
		}
	})
}

// setPod records the session's Ready pod; the session's log names it and
// its node from then on.
func (s *Session) setPod(pod *corev1.Pod) {
	s.sawPod(pod) // what happens to it later is replayed from here
	s.pod, s.podUID, s.node = pod.Name, pod.UID, pod.Spec.NodeName
	s.log = s.log.With("pod", s.pod, "node", s.node)
}

// Ref implements executor.Session.
func (s *Session) Ref() executor.Ref { return s.ref }

// Dirs implements executor.Session. Root is the pod's /: the checkout
// and the step scripts go in in one exec.
func (s *Session) Dirs() executor.Dirs {
	d := executor.PodDirs()
	d.Root = "/"
	return d
}

// Put implements executor.Session: the tar stream goes in over exec
// stdin straight into the pod's tar, with no staging and no digest of
// the whole stream in the pod (on a busy node that pass cost a quarter of
// a restore: docs/performance.md). The runner re-encodes the stream entry
// by entry and closes it with an entry of a name drawn for this transfer
// and no end-of-archive blocks, so the pod's tar stops at the stream's
// end: the pod reports the closing entry only when tar extracted it, and
// a stream that did not arrive whole is ErrTransferCorrupt. Bytes changed
// on the way are for the exec's transport (TLS, TCP) to refuse, and tar
// refuses a header whose checksum does not match.
func (s *Session) Put(ctx context.Context, dir string, r io.Reader) error {
	mark := putMark(dir)
	start := time.Now()
	pr, pw := io.Pipe()
	encoded := make(chan error, 1)
	go func() {
		err := closeWithMark(r, pw, mark)
		pw.CloseWithError(err)
		encoded <- err
	}()
	var stderr bytes.Buffer
	counted := &tarstream.CountingReader{R: pr}
	code, err := s.exec(ctx, []string{"sh", "-c", putScript, "knotless-put", dir, mark}, kubeexec.Streams{Stdin: counted, Stderr: &stderr})
	pr.CloseWithError(errors.New("the exec ended"))
	encErr := <-encoded
	switch {
	case err != nil:
		return fmt.Errorf("put %s: %w", dir, err)
	case code != 0:
		return fmt.Errorf("put %s: tar in the pod exited %d: %s", dir, code, otherLines(stderr.String(), "knotless: end "))
	case encErr != nil:
		return fmt.Errorf("put %s: %w", dir, encErr)
	case !strings.Contains(stderr.String(), "knotless: end "+mark+"\n"):
		return fmt.Errorf("put %s: %w: the pod did not extract the stream's closing entry (%d bytes sent)", dir, executor.ErrTransferCorrupt, counted.N)
	}
	took := time.Since(start)
	s.ex.obs.Transferred(executor.DirectionIn, counted.N, took)
	s.log.Info("transfer in", "dir", dir, "bytes", counted.N, "duration", took.Round(time.Millisecond))
	return nil
}

// putMark draws the name of a transfer's closing entry, relative to the
// directory it is put at: in that directory, but for the pod's / (the
// root transfer of the checkout and the step scripts), which the step
// user cannot write, in the transfer volume.
func putMark(dir string) string {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	mark := ".knotless-put-" + hex.EncodeToString(nonce[:])
	if path.Clean(dir) == "/" {
		return strings.TrimPrefix(transferDir, "/") + "/" + mark
	}
	return mark
}

// closeWithMark copies the tar stream r to w entry by entry and closes
// it with an empty file named mark in place of the end-of-archive blocks.
// Its writes reach w in blocks of putBlock bytes: each write to the exec's
// stdin becomes a message of its own all the way to the pod, and a tar
// writer's are a header, a small file or a padding each.
func closeWithMark(r io.Reader, w io.Writer, mark string) error {
	bw := bufio.NewWriterSize(w, putBlock)
	tr, tw := tar.NewReader(r), tar.NewWriter(bw)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return fmt.Errorf("read tar stream: %w", err)
		}
		// The writer picks a format that holds the header.
		hdr.Format = tar.FormatUnknown
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("tar entry %q: %w", hdr.Name, err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: mark, Mode: 0o600}); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return bw.Flush()
}

// putBlock is the size of the writes to a Put's exec stdin: client-go
// reads stdin 32 KiB at a time.
const putBlock = 32 << 10

// otherLines is the lines of text that do not start with prefix, joined.
func otherLines(text, prefix string) string {
	var other []string
	for _, line := range strings.Split(text, "\n") {
		if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, prefix) {
			other = append(other, line)
		}
	}
	return strings.Join(other, "; ")
}

// Get implements executor.Session. The outputs directory, when the
// last step's exit line said it was empty (the step tool looks once it
// has killed what the step left running), is an empty tar stream
// without an exec into the pod: most runs write no outputs, and the
// exec was a round trip between the last step and the verdict.
func (s *Session) Get(ctx context.Context, dir string, w io.Writer) error {
	start := time.Now()
	s.mu.Lock()
	empty := dir == s.Dirs().Outputs && s.emptyAfter != "" && s.emptyAfter == s.lastStep
	s.mu.Unlock()
	if empty {
		counted := &tarstream.CountingWriter{W: w}
		if err := tar.NewWriter(counted).Close(); err != nil {
			return fmt.Errorf("get %s: %w", dir, err)
		}
		took := time.Since(start)
		s.ex.obs.Transferred(executor.DirectionOut, counted.N, took)
		s.log.Info("transfer out", "dir", dir, "bytes", counted.N, "duration", took.Round(time.Millisecond), "empty_at_step_end", true)
		return nil
	}
	h := md5.New()
	var stderr bytes.Buffer
	counted := &tarstream.CountingWriter{W: io.MultiWriter(w, h)}
	code, err := s.exec(ctx, []string{"sh", "-c", getScript, "knotless-get", dir}, kubeexec.Streams{Stdout: counted, Stderr: &stderr})
	if err != nil {
		return fmt.Errorf("get %s: %w", dir, err)
	}
	if err := checkDigest(code, stderr.String(), h.Sum(nil)); err != nil {
		return fmt.Errorf("get %s: %w", dir, err)
	}
	took := time.Since(start)
	s.ex.obs.Transferred(executor.DirectionOut, counted.N, took)
	s.log.Info("transfer out", "dir", dir, "bytes", counted.N, "duration", took.Round(time.Millisecond))
	return nil
}

// checkDigest compares the digest the pod printed with ours.
func checkDigest(code int, stderr string, ours []byte) error {
	theirs := ""
	var other []string
	for _, line := range strings.Split(stderr, "\n") {
		if d, ok := strings.CutPrefix(line, "knotless: digest "); ok {
			theirs = strings.TrimSpace(d)
		} else if strings.TrimSpace(line) != "" {
			other = append(other, line)
		}
	}
	if code != 0 {
		return fmt.Errorf("tar in the pod exited %d: %s", code, strings.Join(other, "; "))
	}
	if theirs != hex.EncodeToString(ours) {
		return fmt.Errorf("%w: digests differ (pod %q, runner %s)", executor.ErrTransferCorrupt, theirs, hex.EncodeToString(ours))
	}
	return nil
}

// StartStep implements executor.Session. It returns once the pod has read
// the payload and started the step; the output is then pumped into the
// runner in the background, reattaching when the stream drops.
func (s *Session) StartStep(ctx context.Context, id string, payload []byte) error {
	st, err := s.newStep(id, 0)
	if err != nil {
		return err
	}
	started := make(chan struct{})
	s.wg.Add(1)
	go s.pump(id, st, "start", payload, started)
	select {
	case <-started:
		s.log.Info("step started in pod", "step", id, "after", time.Since(st.since).Round(time.Millisecond))
		return nil
	case <-st.done:
		if st.err != nil {
			return fmt.Errorf("start step %s: %w", id, st.err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Session) newStep(id string, offset int64) (*step, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, fmt.Errorf("session %s is stopped", s.ref)
	}
	if _, dup := s.steps[id]; dup {
		return nil, fmt.Errorf("step %s already started", id)
	}
	if s.steps == nil {
		s.steps = map[string]*step{}
		var ctx context.Context
		ctx, s.cancel = context.WithCancel(context.Background())
		s.pumpCtx = ctx
	}
	s.lastStep = id
	st := &step{out: spool.NewAt(offset), done: make(chan struct{}), since: time.Now()}
	st.ended = func(exit executor.Exit, err error) { s.logStepEnd(id, st, exit, err) }
	s.steps[id] = st
	return st, nil
}

// logStepEnd logs how a step ended and how long after this process
// started it (or began following it).
func (s *Session) logStepEnd(id string, st *step, exit executor.Exit, err error) {
	took := time.Since(st.since).Round(time.Millisecond)
	switch {
	case st.released:
		s.log.Info("step no longer followed: the session was released or stopped", "step", id, "duration", took, "offset", st.out.Len())
	case err != nil:
		s.log.Warn("step ended in pod without an exit status", "step", id, "duration", took, "followed", st.followed, "err", err)
	default:
		s.log.Info("step ended in pod", "step", id, "exit", exit.Code, "duration", took, "followed", st.followed, "output_bytes", st.out.Len())
	}
}

// pump owns one step's streams: the launching exec, then follow execs
// from the last byte received whenever a stream ends without the step's
// exit line. It never reports success for a stream that merely ended.
// The step is settled as soon as its exit is acknowledged: the exec's own
// end (the pod removing the step's files) is not waited for by the step's
// caller, only by the session.
func (s *Session) pump(id string, st *step, mode string, payload []byte, started chan struct{}) {
	defer s.wg.Done()
	ctx := s.pumpCtx
	wait := reattachFirst
	var lastErr error
	var exit executor.Exit
	var failed error
	var dropped time.Time // when the stream first dropped
	defer func() { st.settle(exit, failed) }()
	for attempt := 0; ; attempt++ {
		offset := st.out.Len()
		ctrl := &control{started: started}
		in := &stdinFeed{ctrl: ctrl, out: st.out, ctx: ctx, acked: func(code int, outputsEmpty bool) {
			if outputsEmpty {
				s.mu.Lock()
				s.emptyAfter = id
				s.mu.Unlock()
			}
			st.settle(executor.Exit{Code: code}, nil)
		}}
		if mode == "start" {
			in.first = launchInput(payload)
		}
		cmd := []string{"sh", "-c", stepScript, "knotless-step", mode, stepStateDir, id, strconv.FormatInt(offset, 10), s.Dirs().Outputs}
		_, err := s.execIn(ctx, s.stepContainer(id), cmd, kubeexec.Streams{Stdin: in, Stdout: st.out, Stderr: ctrl})
		if code, final, ok := ctrl.result(); ok && st.out.Len() >= final {
			exit = executor.Exit{Code: code}
			break
		}
		if ctrl.isUnknown() {
			failed = fmt.Errorf("%w: the step's status file is missing and its supervisor is gone", executor.ErrExitUnknown)
			break
		}
		if dropped.IsZero() {
			dropped = time.Now()
		}
		if gone := s.jobGone(ctx, err, dropped); gone != nil {
			failed = gone
			break
		}
		if mode == "start" && !ctrl.hasStarted() {
			failed = fmt.Errorf("launch in pod %s: %v", s.pod, orElse(err, "the launcher ended before starting the step"))
			break
		}
		if ctx.Err() != nil {
			st.released = true
			failed = fmt.Errorf("%w: session stopped while following", executor.ErrExitUnknown)
			break
		}
		lastErr = orElseErr(err, "stream ended without the step's exit line")
		if attempt >= reattachAttempts {
			failed = fmt.Errorf("%w after %d reattach attempts: %v", executor.ErrExitUnknown, attempt, lastErr)
			break
		}
		s.log.Warn("step stream dropped; reattaching", "step", id, "offset", st.out.Len(), "attempt", attempt+1, "err", lastErr)
		if gone := s.watchPod(ctx, wait, dropped); gone != nil {
			failed = gone
			break
		}
		wait = min(wait*2, reattachMax)
		mode = "follow"
	}
}

// launchInput is what the step tool reads at start: the payload's count
// of lines, then the payload, ending in a newline. The tool reads whole
// lines with the shell's own read, which needs no process of its own.
func launchInput(payload []byte) []byte {
	if len(payload) == 0 || payload[len(payload)-1] != '\n' {
		payload = append(payload[:len(payload):len(payload)], '\n')
	}
	return fmt.Appendf(nil, "%d\n%s", bytes.Count(payload, []byte{'\n'}), payload)
}

// jobGone returns an error saying so when the run's Job or pod has been
// deleted, or its node is gone: no reattach can help then. execErr is
// how the step's last exec failed, dropped when the stream first did.
func (s *Session) jobGone(ctx context.Context, execErr error, dropped time.Time) error {
	_, cs, _, err := s.ex.clients.get()
	if err != nil {
		return nil
	}
	job, err := cs.BatchV1().Jobs(s.ref.Namespace).Get(ctx, s.ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("job %s/%s was deleted while the step ran", s.ref.Namespace, s.ref.Name)
	case err == nil && job.DeletionTimestamp != nil:
		return fmt.Errorf("job %s/%s is being deleted while the step ran", s.ref.Namespace, s.ref.Name)
	}
	pod, err := cs.CoreV1().Pods(s.ref.Namespace).Get(ctx, s.pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// Deleted during the exec: what the pod last said (the pod
		// garbage collector's mark) is replayed by a watch from the
		// version seen before.
		if s.lastPodVersion() != "" {
			if gone := s.watchPod(ctx, podReplayWait, dropped); gone != nil {
				return gone
			}
		}
		// Evicted, then deleted: the kubelet's event outlives the pod.
		if why := s.evictedEvent(ctx, s.podUID, podReplayWait); why != "" {
			return s.evictedError(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: s.pod}, Spec: corev1.PodSpec{NodeName: s.node}}, why)
		}
		return executor.Lost(fmt.Errorf("pod %s/%s was deleted while the step ran", s.ref.Namespace, s.pod))
	case err != nil:
		return nil
	}
	s.sawPod(pod)
	// A node that is gone (a cloud deletes the Node of a machine it lost)
	// takes the pod with it, though its object stays a while: until the
	// pod garbage collector marks it (what the runner's own credential
	// sees) and deletes it. Reading the Node, where the credential may,
	// says so at once.
	if node, why, lost := nodeLost(pod); lost {
		return s.lostNodeError(node, why)
	}
	if ended := s.podEnded(ctx, pod); ended != nil {
		return ended
	}
	if node := pod.Spec.NodeName; node != "" {
		if _, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return s.lostNodeError(node, "its Node was deleted")
		}
	}
	if execFoundNoNode(execErr, pod) {
		return s.lostNodeError(pod.Spec.NodeName, "the API server has no Node "+pod.Spec.NodeName+" to reach the pod through")
	}
	if pod.DeletionTimestamp != nil {
		return executor.Lost(fmt.Errorf("pod %s/%s on node %s is being deleted while the step ran", s.ref.Namespace, s.pod, pod.Spec.NodeName))
	}
	return nil
}

// FollowStep implements executor.Session.
func (s *Session) FollowStep(ctx context.Context, id string, offset int64, out io.Writer) (executor.Exit, error) {
	s.mu.Lock()
	st, ok := s.steps[id]
	s.mu.Unlock()
	if !ok {
		// A step started by another process: follow it from the offset
		// that process reached.
		var err error
		if st, err = s.newStep(id, offset); err != nil {
			return executor.Exit{}, err
		}
		st.followed = true
		s.log.Info("step followed in pod", "step", id, "offset", offset)
		s.wg.Add(1)
		go s.pump(id, st, "follow", nil, make(chan struct{}))
	}
	if err := st.out.FollowUntil(ctx, offset, out, st.done); err != nil {
		return executor.Exit{}, err
	}
	return st.exit, st.err
}

// KillStep implements executor.Session: the step's whole session and
// every process it started are killed inside the pod.
func (s *Session) KillStep(ctx context.Context, id string) error {
	var stderr bytes.Buffer
	code, err := s.execIn(ctx, s.stepContainer(id), []string{"sh", "-c", stepScript, "knotless-step", "kill", stepStateDir, id}, kubeexec.Streams{Stderr: &stderr})
	if err != nil {
		return fmt.Errorf("kill step %s: %w", id, err)
	}
	if code != 0 {
		return fmt.Errorf("kill step %s: exit %d: %s", id, code, strings.TrimSpace(stderr.String()))
	}
	s.log.Info("step killed", "step", id)
	return nil
}

// Release implements executor.Releaser: the pumps end without
// acknowledging any output, so each step's spool stays in the pod for a
// successor that follows it from where this process stopped.
func (s *Session) Release() {
	s.mu.Lock()
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	s.steps = nil // a step followed again gets a pump of its own
	s.mu.Unlock()
}

// Stop implements executor.Session: it ends the pumps, deletes the Job
// and waits until its pod is gone. A Stop after one that failed tries
// again.
func (s *Session) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.stopped = true
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if s.keep {
		// The pod stays for a look; the run no longer holds it, and a
		// drain may take it.
		return s.deleteBudget(ctx)
	}
	s.deleteMu.Lock()
	defer s.deleteMu.Unlock()
	if s.deleted {
		return nil
	}
	if err := s.deleteJob(ctx); err != nil {
		s.ex.cleanupFailures.Add(1)
		s.ex.obs.CleanupFailed()
		s.log.Error("delete job", "err", err, "cleanup_failures_total", s.ex.cleanupFailures.Load())
		return err
	}
	s.deleted = true
	return nil
}

func (s *Session) deleteJob(ctx context.Context) error {
	_, cs, _, err := s.ex.clients.get()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := deleteJob(ctx, cs.BatchV1().Jobs(s.ref.Namespace), s.ref.Name, s.uid); err != nil {
		return err
	}
	s.ex.warm.forget(s.ref.Name) // a Job taken from the warm pods
	// Its pods are going: the budget has nothing left to guard. One
	// not deleted here goes with the Job (its owner).
	if err := deleteBudget(ctx, cs, s.ref.Namespace, s.ref.Name); err != nil {
		s.log.Warn("disruption budget not deleted; it goes with its Job", "err", err)
	}
	ctx, cancel := context.WithTimeout(ctx, deleteWait)
	defer cancel()
	sel := podsOfJob(s.uid)
	checked, leftToGC := map[string]bool{}, map[string]bool{}
	for {
		pods, err := cs.CoreV1().Pods(s.ref.Namespace).List(ctx, sel)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("confirm pods of job %s are gone: %w", s.ref.Name, err)
		}
		if err == nil && len(pods.Items) == 0 {
			s.log.Info("job deleted", "after", time.Since(start).Round(time.Millisecond))
			return nil
		}
		s.forceDeleteOnLostNodes(ctx, cs, pods.Items, checked, leftToGC)
		if err == nil && allIn(pods.Items, leftToGC) {
			// Nothing but pods of a lost node the runner may not delete:
			// the pod garbage collector deletes them (up to 80 s after
			// the Node went); waiting here would only hold the run.
			s.log.Info("job deleted; its pods on a lost node are left to the pod garbage collector",
				"pods", len(pods.Items), "node", s.knownLostNode(), "after", time.Since(start).Round(time.Millisecond))
			return nil
		}
		opts := sel
		opts.ResourceVersion = pods.ResourceVersion
		w, err := cs.CoreV1().Pods(s.ref.Namespace).Watch(ctx, opts)
		if err != nil {
			return fmt.Errorf("watch pods of job %s: %w", s.ref.Name, err)
		}
		// Any change may be the last pod going: list again.
		select {
		case <-w.ResultChan():
		case <-ctx.Done():
		}
		w.Stop()
		if ctx.Err() != nil {
			return fmt.Errorf("pods of job %s still there after deleting it: %w", s.ref.Name, ctx.Err())
		}
	}
}

// deleteBudget deletes the run's disruption budget, as Stop does for a
// kept Job.
func (s *Session) deleteBudget(ctx context.Context) error {
	_, cs, _, err := s.ex.clients.get()
	if err != nil {
		return err
	}
	if err := deleteBudget(ctx, cs, s.ref.Namespace, s.ref.Name); err != nil {
		s.log.Error("delete disruption budget of a kept job", "err", err)
		return err
	}
	return nil
}

// allIn reports whether every pod of pods is named in set.
func allIn(pods []corev1.Pod, set map[string]bool) bool {
	for i := range pods {
		if !set[pods[i].Name] {
			return false
		}
	}
	return true
}

// cleanupAfterFailedStart deletes the Job of a session that never became
// ready, also when the caller's context is gone.
func (s *Session) cleanupAfterFailedStart(ctx context.Context) {
	if s.keep {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteWait)
	defer cancel()
	if err := s.deleteJob(ctx); err != nil {
		s.ex.cleanupFailures.Add(1)
		s.ex.obs.CleanupFailed()
		s.log.Error("delete job after failed start", "err", err, "cleanup_failures_total", s.ex.cleanupFailures.Load())
	}
}

// control parses the step tool's control lines on stderr.
type control struct {
	started chan struct{}

	mu      sync.Mutex
	partial []byte
	start   bool
	exit    *[2]int64 // code, final length
	// outputsEmpty: the exit line said the outputs directory was empty
	// at the step's end.
	outputsEmpty bool
	unknown      bool
	ack          chan struct{}
}

func (c *control) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, p...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(c.partial[:i])
		c.partial = c.partial[i+1:]
		switch {
		case line == "knotless: started":
			if !c.start {
				c.start = true
				close(c.started)
			}
		case line == "knotless: unknown":
			c.unknown = true
		case strings.HasPrefix(line, "knotless: exit "):
			f := strings.Fields(strings.TrimPrefix(line, "knotless: exit "))
			empty := len(f) == 3 && f[2] == "outputs-empty"
			if len(f) == 2 || empty {
				code, err1 := strconv.ParseInt(f[0], 10, 32)
				n, err2 := strconv.ParseInt(f[1], 10, 64)
				if err1 == nil && err2 == nil {
					c.exit = &[2]int64{code, n}
					c.outputsEmpty = empty
					if c.ack != nil {
						close(c.ack)
						c.ack = nil
					}
				}
			}
		}
	}
}

func (c *control) result() (int, int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exit == nil {
		return 0, 0, false
	}
	return int(c.exit[0]), c.exit[1], true
}

func (c *control) emptyOutputs() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.outputsEmpty
}

func (c *control) isUnknown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unknown
}

func (c *control) hasStarted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start
}

// exitSeen returns a channel closed when the exit line has arrived.
func (c *control) exitSeen() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	if c.exit != nil {
		close(ch)
	} else {
		c.ack = ch
	}
	return ch
}

// stdinFeed is the step tool's stdin: first the payload, then, once the
// exit line has come and every byte it counts is here, "ok".
type stdinFeed struct {
	ctx   context.Context
	ctrl  *control
	out   *spool.Spool
	first []byte
	sent  bool
	acked func(code int, outputsEmpty bool) // called once the runner holds every byte
}

func (f *stdinFeed) Read(p []byte) (int, error) {
	if len(f.first) > 0 {
		n := copy(p, f.first)
		f.first = f.first[n:]
		return n, nil
	}
	if f.sent {
		return 0, io.EOF
	}
	select {
	case <-f.ctrl.exitSeen():
	case <-f.ctx.Done():
		return 0, io.EOF
	}
	code, final, _ := f.ctrl.result()
	if err := f.out.WaitLen(f.ctx, final); err != nil {
		return 0, io.EOF
	}
	f.sent = true
	f.acked(code, f.ctrl.emptyOutputs())
	return copy(p, "ok\n"), nil
}

func orElse(err error, msg string) string {
	if err != nil {
		return err.Error()
	}
	return msg
}

func orElseErr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}
