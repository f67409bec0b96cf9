package checks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/tests/pds"
)

// heldWrites is the runner's HTTP transport to the PDS: it notes each
// write call with its status, and holds the first write after hold()
// until its release.
type heldWrites struct {
	mu      sync.Mutex
	calls   []string
	holding chan struct{} // nil: hold nothing
	held    chan struct{} // closed once the held write arrived
	// beforeBatch, when set, is called (once) before the next batch is
	// sent: another writer's commit just before it.
	beforeBatch func()
}

// hold holds the next write until the returned release is closed.
func (h *heldWrites) hold() (release chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holding, h.held = make(chan struct{}), make(chan struct{})
	return h.holding
}

func (h *heldWrites) RoundTrip(req *http.Request) (*http.Response, error) {
	method := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
	write := method == "com.atproto.repo.putRecord" || method == "com.atproto.repo.applyWrites"
	var wait chan struct{}
	h.mu.Lock()
	if write && h.holding != nil {
		wait, h.holding = h.holding, nil
		close(h.held)
	}
	var before func()
	if method == "com.atproto.repo.applyWrites" {
		before, h.beforeBatch = h.beforeBatch, nil
	}
	h.mu.Unlock()
	if before != nil {
		before()
	}
	if wait != nil {
		<-wait
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if write && err == nil {
		h.mu.Lock()
		h.calls = append(h.calls, fmt.Sprintf("%s %d", method, resp.StatusCode))
		h.mu.Unlock()
	}
	return resp, err
}

func (h *heldWrites) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.calls
	h.calls = nil
	return c
}

// runnerOnAPDS starts a PDS with a runner's account: login logs in to it
// with an HTTP transport of the test's, checkOf makes a check record of
// a push of the runner's own. It skips under -short.
func runnerOnAPDS(t *testing.T) (login func(http.RoundTripper) *pdsclient.Account, checkOf func(string, Status) forge.Check) {
	if testing.Short() {
		t.Skip(pds.ErrSkip)
	}
	t.Parallel()
	ctx := context.Background()
	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	runner, err := srv.CreateAccount(ctx, "runner")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	login = func(h http.RoundTripper) *pdsclient.Account {
		acct, _, err := pdsclient.Login(ctx, pdsclient.LoginConfig{Host: srv.URL, Identifier: runner.DID.String(), Password: runner.Password,
			HTTP: &http.Client{Transport: h}}, cat)
		if err != nil {
			t.Fatal(err)
		}
		return acct
	}
	checkOf = func(key string, s Status) forge.Check {
		return forge.Check{Type: forge.CollectionCheck, Workflow: "ci", Status: string(s), CreatedAt: forge.Now(),
			Subject: forge.Subject{Repo: "at://" + runner.DID.String() + "/" + forge.CollectionRepo + "/hello",
				Commit: strings.Repeat(key, 40)[:40], Event: "at://" + runner.DID.String() + "/dev.knotless.refUpdate/" + key, Kind: "push"}}
	}
	return login, checkOf
}

// TestGroupCommitOnThePDS writes the checks of four runs at once on a
// real PDS, the first write held so that the three others wait for it:
// they go as one commit (applyWrites), created or updated as they
// should be, and a wrong guess of which records exist costs one refused
// batch, its writes then made one by one.
func TestGroupCommitOnThePDS(t *testing.T) {
	ctx := context.Background()
	login, checkOf := runnerOnAPDS(t)
	h := &heldWrites{}
	acct := login(h)
	rec := NewRecorder(acct, nil)
	keys := []string{"a", "b", "c", "d"}
	// round writes every key's check by t to status s, key a's write
	// held until the others wait in the queue, and returns the write
	// calls made.
	round := func(t *testing.T, tr Transition, s Status, keys []string) []string {
		t.Helper()
		release := h.hold()
		errs := make(chan error, len(keys))
		go func() { errs <- rec.Write(ctx, tr, keys[0], checkOf(keys[0], s)) }()
		select {
		case <-h.held:
		case err := <-errs:
			t.Fatalf("write %s did not reach the PDS: %v", keys[0], err)
		}
		for i, key := range keys[1:] {
			go func() { errs <- rec.Write(ctx, tr, key, checkOf(key, s)) }()
			queued(t, rec.commit, i+1)
		}
		close(release)
		for range keys {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		for _, key := range keys {
			var got forge.Check
			if _, err := acct.Get(ctx, forge.CollectionCheck, key, &got); err != nil || got.Status != string(s) {
				t.Fatalf("check %s on the PDS: %s (%v), want %s", key, got.Status, err, s)
			}
		}
		return h.take()
	}

	if got, want := round(t, Start, Running, keys), []string{"com.atproto.repo.putRecord 200", "com.atproto.repo.applyWrites 200"}; !slices.Equal(got, want) {
		t.Errorf("four running checks at once: %q, want %q (the held one alone, the three that waited in one commit)", got, want)
	}
	if got, want := round(t, Finish, Success, keys), []string{"com.atproto.repo.putRecord 200", "com.atproto.repo.applyWrites 200"}; !slices.Equal(got, want) {
		t.Errorf("four final checks at once: %q, want %q", got, want)
	}
	// The recorder forgets c: it takes c's record for a new one, and
	// the PDS refuses to create it again (500: it does not say why).
	// Made alone, c's write is a create that must find no record: it
	// loses its compare-and-swap, and c stays as it was.
	rec.Forget(func(key string, _ forge.Check) bool { return key == "c" })
	release := h.hold()
	errs := make(chan error, 3)
	go func() { errs <- rec.Write(ctx, Invalid, "a", checkOf("a", Error)) }()
	<-h.held
	for i, key := range []string{"b", "c"} {
		go func() { errs <- rec.Write(ctx, Invalid, key, checkOf(key, Error)) }()
		queued(t, rec.commit, i+1)
	}
	close(release)
	lost := 0
	for range 3 {
		switch err := <-errs; {
		case errors.Is(err, pdsclient.ErrSwapLost):
			lost++
		case err != nil:
			t.Fatal(err)
		}
	}
	got := h.take()
	slices.Sort(got[2:])
	if lost != 1 || len(got) != 4 || got[0] != "com.atproto.repo.putRecord 200" || got[1] == "com.atproto.repo.applyWrites 200" || !strings.HasPrefix(got[1], "com.atproto.repo.applyWrites ") ||
		got[2] != "com.atproto.repo.putRecord 200" || got[3] != "com.atproto.repo.putRecord 400" {
		t.Errorf("a batch with a wrong guess: %q, %d lost swaps; want the held write, the refused batch, then its two writes one by one, c's refused (1 lost swap)", got, lost)
	}
	for key, want := range map[string]Status{"a": Error, "b": Error, "c": Success} {
		var c forge.Check
		if _, err := acct.Get(ctx, forge.CollectionCheck, key, &c); err != nil || c.Status != string(want) {
			t.Errorf("check %s on the PDS: %s (%v), want %s", key, c.Status, err, want)
		}
	}
	if c, _ := rec.Get("c"); c.Status != string(Success) {
		t.Errorf("after the lost swap the recorder knows c as %s, want the record read back (success)", c.Status)
	}
}

// TestChecksCompareAndSwapOnThePDS: two processes of one runner (two
// recorders, one account) write the same check. Every write is a
// compare-and-swap: the second create of a record, an update from a
// record another writer moved on, and a final check over another's
// final one all lose, write nothing, and leave the recorder knowing the
// record as read; a batch after another writer's commit is refused as a
// whole and its writes made one by one; a check known without its CID
// (owed by an earlier process) is read before it is written.
func TestChecksCompareAndSwapOnThePDS(t *testing.T) {
	ctx := context.Background()
	login, checkOf := runnerOnAPDS(t)
	h := &heldWrites{}
	acctA := login(h)
	a, b := NewRecorder(acctA, nil), NewRecorder(login(http.DefaultTransport), nil)
	lostB := 0
	b.OnSwapLost(func() { lostB++ })
	onPDS := func(key string) Status {
		var c forge.Check
		if _, err := acctA.Get(ctx, forge.CollectionCheck, key, &c); err != nil {
			t.Fatalf("read check %s: %v", key, err)
		}
		return Status(c.Status)
	}

	if err := a.Write(ctx, Start, "k", checkOf("k", Running)); err != nil {
		t.Fatal(err)
	}
	// B has not seen k: its create loses.
	if err := b.Write(ctx, Start, "k", checkOf("k", Running)); !errors.Is(err, pdsclient.ErrSwapLost) {
		t.Fatalf("a second create of check k: %v, want a lost swap", err)
	}
	if err := a.Write(ctx, Finish, "k", checkOf("k", Success)); err != nil {
		t.Fatalf("the first writer's final check after the other's lost create: %v", err)
	}
	// B knows k as running, at the CID it read: its final check loses
	// to A's, and is not owed.
	final, err := b.Final(ctx, Finish, "k", checkOf("k", Failure), slog.New(slog.DiscardHandler))
	if err != nil || Status(final.Status) != Success {
		t.Errorf("a final check over another writer's: %s, %v; want the other's success returned, nothing owed", final.Status, err)
	}
	if got := onPDS("k"); got != Success || lostB != 2 {
		t.Errorf("check k is %s on the PDS after %d lost swaps, want success after 2", got, lostB)
	}

	// A batch of A's after B wrote another record: refused as a whole
	// (swapCommit), each write then made alone.
	for _, key := range []string{"m", "n", "o"} {
		if err := a.Write(ctx, Start, key, checkOf(key, Running)); err != nil {
			t.Fatal(err)
		}
	}
	h.take()
	h.mu.Lock()
	h.beforeBatch = func() {
		if err := b.Write(ctx, Start, "p", checkOf("p", Running)); err != nil {
			t.Error(err)
		}
	}
	h.mu.Unlock()
	release := h.hold()
	errs := make(chan error, 3)
	go func() { errs <- a.Write(ctx, Finish, "m", checkOf("m", Success)) }()
	<-h.held
	for i, key := range []string{"n", "o"} {
		go func() { errs <- a.Write(ctx, Finish, key, checkOf(key, Success)) }()
		queued(t, a.commit, i+1)
	}
	close(release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	calls := h.take()
	slices.Sort(calls[2:])
	if want := []string{"com.atproto.repo.putRecord 200", "com.atproto.repo.applyWrites 400", "com.atproto.repo.putRecord 200", "com.atproto.repo.putRecord 200"}; !slices.Equal(calls, want) {
		t.Errorf("a batch after another writer's commit: %q, want %q", calls, want)
	}
	// The batch after that one goes as one commit again.
	release = h.hold()
	go func() { errs <- a.Write(ctx, Finish, "q", checkOf("q", Success)) }()
	<-h.held
	for i, key := range []string{"r", "s"} {
		go func() { errs <- a.Write(ctx, Start, key, checkOf(key, Running)) }()
		queued(t, a.commit, i+1)
	}
	close(release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if calls, want := h.take(), []string{"com.atproto.repo.putRecord 200", "com.atproto.repo.applyWrites 200"}; !slices.Equal(calls, want) {
		t.Errorf("the next batch: %q, want %q", calls, want)
	}
	for _, key := range []string{"m", "n", "o"} {
		if got := onPDS(key); got != Success {
			t.Errorf("check %s is %s, want success", key, got)
		}
	}

	// A check owed by an earlier process is known without its CID: it
	// is read first, then written over what is there.
	c := NewRecorder(login(http.DefaultTransport), nil)
	c.Know("p", checkOf("p", Success))
	if err := c.Write(ctx, Finish, "p", checkOf("p", Success)); err != nil {
		t.Fatalf("write an owed check known without its CID: %v", err)
	}
	if got := onPDS("p"); got != Success {
		t.Errorf("check p is %s, want the owed success", got)
	}
}
