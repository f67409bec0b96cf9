package conformance

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/executor"
)

// The optional capabilities (executor.Capabilities): each has a case
// that runs when the executor has it. Which it has is asked once, of
// one executor of the harness, as the daemon asks at start.

func runCapabilities(t *testing.T, h Harness) {
	caps := executor.CapabilitiesOf(h.New(t))
	if caps.Resumer != nil {
		t.Run("resume", func(t *testing.T) { t.Parallel(); testResume(t, h) })
		// A session is released when the run detaches, and only an
		// executor that resumes sessions detaches.
		t.Run("release", func(t *testing.T) { t.Parallel(); testRelease(t, h) })
	}
	if caps.Health != nil {
		t.Run("health", func(t *testing.T) { t.Parallel(); testHealth(t, h) })
	}
	if caps.Gone != nil {
		t.Run("gone", func(t *testing.T) { t.Parallel(); testGone(t, h) })
	}
	if caps.Stopper != nil {
		t.Run("stop by ref", func(t *testing.T) { t.Parallel(); testStopSession(t, h) })
	}
	if h.Fenced {
		t.Run("fence", func(t *testing.T) { t.Parallel(); testFence(t, h) })
	}
	if caps.Images != nil {
		t.Run("check image", func(t *testing.T) { t.Parallel(); testCheckImage(t, h) })
	}
}

// unreachableImage is in a registry nobody answers for: an address of
// the loopback where nothing listens (no DNS query, no wait).
const unreachableImage = "127.0.0.1:1/knotless/absent:1"

// testCheckImage: the harness's image can run; one in a registry that
// does not answer cannot, and the error names it.
func testCheckImage(t *testing.T, h Harness) {
	ctx := context.Background()
	c := executor.CapabilitiesOf(h.New(t)).Images
	if err := c.CheckImage(ctx, h.Image); err != nil {
		t.Errorf("check the harness's image %s: %v", h.Image, err)
	}
	err := c.CheckImage(ctx, unreachableImage)
	if err == nil || !strings.Contains(err.Error(), unreachableImage) {
		t.Errorf("check %s: %v, want an error naming it", unreachableImage, err)
	}
	t.Logf("check %s: %v", unreachableImage, err)
}

// session starts a session of ex for one case, stopped at the end.
func session(t *testing.T, ex executor.Executor, h Harness) executor.Session {
	t.Helper()
	sess, err := ex.Start(context.Background(), executor.Spec{RunID: runID(t), Runner: "did:plc:conformance", Image: h.Image, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := sess.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return sess
}

// startScript puts text as the step id's script and starts it.
func startScript(t *testing.T, sess executor.Session, id, text string) {
	t.Helper()
	var tarball bytes.Buffer
	must(t, tarOne(&tarball, id, text))
	must(t, sess.Put(context.Background(), sess.Dirs().Steps, &tarball))
	p := "cd " + sess.Dirs().Work + "\nexec sh -e " + sess.Dirs().Steps + "/" + id + "\n"
	must(t, sess.StartStep(context.Background(), id, []byte(p)))
}

// testResume: a session another process let go of (released, as a
// stopping daemon does) is taken over by its Ref: the new session follows
// the step from its first byte to its exit, takes files and runs the
// next step, and stops. The step ends on its own: a file put to end it
// would race the step's end, whose clean-up kills every process the step
// did not find alive (the put's too, on Kubernetes).
func testResume(t *testing.T, h Harness) {
	ctx := context.Background()
	ex := h.New(t)
	sess := session(t, ex, h)
	startScript(t, sess, "1", "echo before\nsleep 2\necho after\n")
	executor.Release(sess)
	resumed, err := executor.CapabilitiesOf(ex).Resumer.Resume(ctx, sess.Ref())
	if err != nil {
		t.Fatalf("resume %s: %v", sess.Ref(), err)
	}
	if resumed.Ref() != sess.Ref() {
		t.Errorf("resumed %s, want %s", resumed.Ref(), sess.Ref())
	}
	var out bytes.Buffer
	exit, err := resumed.FollowStep(ctx, "1", 0, &out)
	if err != nil || exit.Code != 0 || out.String() != "before\nafter\n" {
		t.Errorf("follow the resumed session: %q exit %d err %v; want before, after, exit 0", out.String(), exit.Code, err)
	}
	var tarball bytes.Buffer
	must(t, tarOne(&tarball, "put-after-resume", ""))
	must(t, resumed.Put(ctx, resumed.Dirs().Work, &tarball))
	startScript(t, resumed, "2", "test -e put-after-resume\n")
	if exit, err := resumed.FollowStep(ctx, "2", 0, io.Discard); err != nil || exit.Code != 0 {
		t.Errorf("the next step on the resumed session: exit %d err %v; want the file put there, exit 0", exit.Code, err)
	}
	must(t, resumed.Stop(ctx))
}

// lockedBuffer is a step's output as a follower sees it.
type lockedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	seen chan struct{} // closed once want shows
	want string
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if b.seen != nil && strings.Contains(b.buf.String(), b.want) {
		close(b.seen)
		b.seen = nil
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testRelease: releasing a session ends its followers at once, with no
// exit; the step goes on, and is followed again from where the output
// stopped, to its end. Nothing of the output is lost or repeated. The
// step ends on its own, as in testResume: a file put to end it raced
// the step's end, whose clean-up kills every process the step did not
// find alive (on Kubernetes the put's tar, which then exited 137).
func testRelease(t *testing.T, h Harness) {
	ctx := context.Background()
	ex := h.New(t)
	sess := session(t, ex, h)
	startScript(t, sess, "1", "echo before\nsleep 4\necho after\n")
	out := &lockedBuffer{seen: make(chan struct{}), want: "before\n"}
	seen := out.seen
	followed := make(chan error, 1)
	go func() {
		_, err := sess.FollowStep(ctx, "1", 0, out)
		followed <- err
	}()
	select {
	case <-seen:
	case err := <-followed:
		t.Fatalf("the step's follower ended before its output: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("no output from the step in 2 minutes")
	}
	if !executor.Release(sess) {
		t.Fatalf("the %s executor resumes sessions, but its session is no executor.Releaser", ex.Name())
	}
	select {
	case err := <-followed:
		if err == nil {
			t.Error("the released follower returned the step's exit, want no exit (the step goes on)")
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the follower did not end when the session was released")
	}
	offset := int64(len(out.String()))
	next, err := executor.CapabilitiesOf(ex).Resumer.Resume(ctx, sess.Ref())
	if err != nil {
		t.Fatalf("resume after the release: %v", err)
	}
	var rest bytes.Buffer
	exit, err := next.FollowStep(ctx, "1", offset, &rest)
	if err != nil || exit.Code != 0 || out.String()+rest.String() != "before\nafter\n" {
		t.Errorf("after the release: %q then %q, exit %d, err %v; want before, after, exit 0", out.String(), rest.String(), exit.Code, err)
	}
}

// testHealth: a working executor says it can take runs.
func testHealth(t *testing.T, h Harness) {
	ex := h.New(t)
	if err := executor.CapabilitiesOf(ex).Health.Health(context.Background()); err != nil {
		t.Errorf("health of a working %s executor: %v", ex.Name(), err)
	}
}

// testStopSession: another process's executor stops a session by its
// Ref while a step runs in it, and returns once it is gone: the session
// can no longer be resumed (or is gone, where the executor can tell).
// Stopping it again is no error.
func testStopSession(t *testing.T, h Harness) {
	ctx := context.Background()
	ex := h.New(t)
	sess, err := ex.Start(ctx, executor.Spec{RunID: runID(t), Runner: "did:plc:conformance", Image: h.Image, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	startScript(t, sess, "1", "echo going\nsleep 300\n")
	executor.Release(sess)
	other := executor.CapabilitiesOf(h.New(t))
	if err := other.Stopper.StopSession(ctx, sess.Ref()); err != nil {
		t.Fatalf("stop %s by its ref: %v", sess.Ref(), err)
	}
	if other.Gone != nil {
		if gone, err := other.Gone.Gone(ctx, sess.Ref()); err != nil || !gone {
			t.Errorf("a session stopped by its ref: gone %v, err %v; want gone", gone, err)
		}
	}
	if other.Resumer != nil {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if _, err := other.Resumer.Resume(rctx, sess.Ref()); err == nil {
			t.Error("a session stopped by its ref resumes")
		}
	}
	if err := other.Stopper.StopSession(ctx, sess.Ref()); err != nil {
		t.Errorf("stop a stopped session again: %v", err)
	}
	_ = sess.Stop(ctx)
}

// testGone: a started session is not gone; a stopped one is.
func testGone(t *testing.T, h Harness) {
	ctx := context.Background()
	ex := h.New(t)
	g := executor.CapabilitiesOf(ex).Gone
	sess := session(t, ex, h)
	if gone, err := g.Gone(ctx, sess.Ref()); err != nil || gone {
		t.Errorf("a started session: gone %v, err %v; want there", gone, err)
	}
	must(t, sess.Stop(ctx))
	if gone, err := g.Gone(ctx, sess.Ref()); err != nil || !gone {
		t.Errorf("a stopped session: gone %v, err %v; want gone", gone, err)
	}
}

// testFence: a second Start of a run whose session lives (from another
// executor: another process of the same runner) fails with
// executor.ErrRunExists and leaves the first session as it was: its
// step goes on to its end. Once the first session is stopped, the run
// starts again (an earlier session being deleted is waited out).
func testFence(t *testing.T, h Harness) {
	ctx := context.Background()
	spec := executor.Spec{RunID: runID(t), Runner: "did:plc:conformance", Image: h.Image, Timeout: 5 * time.Minute}
	first, err := h.New(t).Start(ctx, spec)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	startScript(t, first, "1", "sleep 3\necho still here\n")
	second, err := h.New(t).Start(ctx, spec)
	if !errors.Is(err, executor.ErrRunExists) {
		if second != nil {
			_ = second.Stop(ctx)
		}
		_ = first.Stop(ctx)
		t.Fatalf("a second start of run %s while its session lives: %v, want executor.ErrRunExists", spec.RunID, err)
	}
	t.Logf("the second start: %v", err)
	var out bytes.Buffer
	exit, err := first.FollowStep(ctx, "1", 0, &out)
	if err != nil || exit.Code != 0 || out.String() != "still here\n" {
		t.Errorf("the first session's step after the fenced start: %q, exit %d, err %v; want it whole", out.String(), exit.Code, err)
	}
	if err := first.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	again, err := h.New(t).Start(ctx, spec)
	if err != nil {
		t.Fatalf("start run %s again after its session was stopped: %v", spec.RunID, err)
	}
	if err := again.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
}
