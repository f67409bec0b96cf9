package checks

import (
	"context"
	"fmt"
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
	h.mu.Unlock()
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

// TestGroupCommitOnThePDS writes the checks of four runs at once on a
// real PDS, the first write held so that the three others wait for it:
// they go as one commit (applyWrites), created or updated as they
// should be, and a wrong guess of which records exist costs one refused
// batch, its writes then made one by one.
func TestGroupCommitOnThePDS(t *testing.T) {
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
	h := &heldWrites{}
	acct, _, err := pdsclient.Login(ctx, pdsclient.LoginConfig{Host: srv.URL, Identifier: runner.DID.String(), Password: runner.Password,
		HTTP: &http.Client{Transport: h}}, cat)
	if err != nil {
		t.Fatal(err)
	}
	rec := NewRecorder(acct, nil)
	keys := []string{"a", "b", "c", "d"}
	checkOf := func(key string, s Status) forge.Check {
		return forge.Check{Type: forge.CollectionCheck, Workflow: "ci", Status: string(s), CreatedAt: forge.Now(),
			Subject: forge.Subject{Repo: "at://" + runner.DID.String() + "/" + forge.CollectionRepo + "/hello",
				Commit: strings.Repeat(key, 40)[:40], Event: "at://" + runner.DID.String() + "/dev.knotless.refUpdate/" + key, Kind: "push"}}
	}
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
	rec.Forget(func(key string, _ forge.Check) bool { return key == "c" })
	got := round(t, Invalid, Error, []string{"a", "b", "c"})
	if len(got) != 4 || got[0] != "com.atproto.repo.putRecord 200" || got[1] == "com.atproto.repo.applyWrites 200" || !strings.HasPrefix(got[1], "com.atproto.repo.applyWrites ") ||
		got[2] != "com.atproto.repo.putRecord 200" || got[3] != "com.atproto.repo.putRecord 200" {
		t.Errorf("a batch with a wrong guess: %q, want the held write, the refused batch, then its two writes one by one", got)
	}
}
