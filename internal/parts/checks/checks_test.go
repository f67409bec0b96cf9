package checks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
)

var finals = []Status{Success, Failure, Error, Cancelled}

func TestAllowed(t *testing.T) {
	t.Parallel()
	type move struct {
		t        Transition
		from, to Status
	}
	allowed := []move{
		{Queue, None, Queued}, {Queue, Queued, Queued}, {Queue, Running, Queued},
		{Start, None, Running}, {Start, Queued, Running},
		{Release, Running, Queued}, {Release, Queued, Queued},
		{Supersede, None, Cancelled}, {Supersede, Queued, Cancelled}, {Supersede, Running, Cancelled},
	}
	refused := []move{
		{Start, Running, Running},
		{Release, None, Queued}, {Release, Running, Success},
		{Supersede, Running, Failure},
		{Queue, None, Running}, {Finish, None, Queued}, {Finish, Running, Running},
		{"bogus", None, Queued},
	}
	for _, f := range finals {
		allowed = append(allowed, move{Finish, None, f}, move{Finish, Queued, f}, move{Finish, Running, f},
			move{Finish, f, f}, move{Invalid, f, Error})
		// Once final, a check goes nowhere else: the work is not run again.
		refused = append(refused, move{Queue, f, Queued}, move{Start, f, Running}, move{Release, f, Queued},
			move{Supersede, f, Cancelled}, move{Invalid, None, f})
		for _, g := range finals {
			if g != f {
				refused = append(refused, move{Finish, f, g})
			}
		}
	}
	for _, m := range allowed {
		if err := Allowed(m.t, m.from, m.to); err != nil {
			t.Errorf("Allowed(%s, %q, %q) = %v, want nil", m.t, m.from, m.to, err)
		}
	}
	for _, m := range refused {
		if m.t == Invalid && m.to == Error {
			continue
		}
		err := Allowed(m.t, m.from, m.to)
		var te *TransitionError
		if m.t != "bogus" && !errors.As(err, &te) {
			t.Errorf("Allowed(%s, %q, %q) = %v, want a TransitionError", m.t, m.from, m.to, err)
		}
		if err == nil {
			t.Errorf("Allowed(%s, %q, %q) = nil, want refused", m.t, m.from, m.to)
		}
	}
}

func TestStatusFinal(t *testing.T) {
	t.Parallel()
	for _, s := range []Status{None, Queued, Running} {
		if s.Final() {
			t.Errorf("%q final", s)
		}
	}
	for _, s := range finals {
		if !s.Final() {
			t.Errorf("%q not final", s)
		}
	}
}

// fakePDS is a Writer that answers from a script of errors.
type fakePDS struct {
	mu      sync.Mutex
	errs    []error
	written []string
}

func (f *fakePDS) Put(_ context.Context, _, rkey string, v any) (syntax.ATURI, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var err error
	if len(f.errs) > 0 {
		err, f.errs = f.errs[0], f.errs[1:]
	}
	if err == nil {
		f.written = append(f.written, rkey+" "+v.(forge.Check).Status)
	}
	return "", err
}

var (
	invalid = &atclient.APIError{StatusCode: http.StatusBadRequest, Name: "InvalidRecord"}
	errDown = errors.New("connection refused")
)

func check(s Status) forge.Check {
	return forge.Check{Type: forge.CollectionCheck, Workflow: "ci", Status: string(s), CreatedAt: forge.Now()}
}

func TestRecorderLifecycle(t *testing.T) {
	t.Parallel()
	pds := &fakePDS{}
	var told []string
	r := NewRecorder(pds, func(key string, c forge.Check) { told = append(told, key+" "+c.Status) })
	ctx := t.Context()
	for _, step := range []struct {
		t  Transition
		to Status
	}{{Queue, Queued}, {Start, Running}, {Release, Queued}, {Start, Running}, {Finish, Failure}} {
		if err := r.Write(ctx, step.t, "k", check(step.to)); err != nil {
			t.Fatalf("%s to %s: %v", step.t, step.to, err)
		}
	}
	if err := r.Write(ctx, Start, "k", check(Running)); err == nil {
		t.Fatal("final → running was allowed")
	}
	want := []string{"k queued", "k running", "k queued", "k running", "k failure"}
	if diff := cmp.Diff(want, pds.written); diff != "" {
		t.Errorf("written (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, told); diff != "" {
		t.Errorf("told (-want +got):\n%s", diff)
	}
	if c, _ := r.Get("k"); c.Status != string(Failure) {
		t.Errorf("known status %q, want failure", c.Status)
	}
}

func TestRecorderFinal(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name    string
		errs    []error
		status  Status // remembered
		owed    bool
		written []string
	}{
		{"written", nil, Success, false, []string{"k success"}},
		{"refused: minimal error check", []error{invalid}, Error, false, []string{"k error"}},
		{"refused twice: final all the same", []error{invalid, invalid}, Error, false, nil},
		{"PDS down: owed", []error{errDown}, Success, true, nil},
		{"refused, then down: the minimal one is owed", []error{invalid, errDown}, Error, true, nil},
		{"refused by the lexicon: minimal error check", []error{lexiconRefusal(t)}, Error, false, []string{"k error"}},
		{"refused by the lexicon twice: final, not owed", []error{lexiconRefusal(t), lexiconRefusal(t)}, Error, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pds := &fakePDS{errs: tc.errs}
			r := NewRecorder(pds, nil)
			r.Know("k", check(Running))
			c, err := r.Final(t.Context(), Finish, "k", check(Success), log)
			var owed *OwedError
			if got := errors.As(err, &owed); got != tc.owed {
				t.Errorf("owed = %v (%v), want %v", got, err, tc.owed)
			}
			if !tc.owed && err != nil {
				t.Errorf("err = %v", err)
			}
			if Status(c.Status) != tc.status {
				t.Errorf("returned %q, want %q", c.Status, tc.status)
			}
			if known, _ := r.Get("k"); Status(known.Status) != tc.status {
				t.Errorf("remembered %q, want %q", known.Status, tc.status)
			}
			if r.Pending("", "") {
				t.Error("the work is still pending after its final check")
			}
			if diff := cmp.Diff(tc.written, pds.written); diff != "" {
				t.Errorf("written (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRecorderFinalRefusesIllegalMove(t *testing.T) {
	t.Parallel()
	pds := &fakePDS{}
	r := NewRecorder(pds, nil)
	r.Know("k", check(Success))
	_, err := r.Final(t.Context(), Finish, "k", check(Failure), slog.New(slog.DiscardHandler))
	var te *TransitionError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a TransitionError", err)
	}
	if len(pds.written) != 0 {
		t.Errorf("written %v, want nothing", pds.written)
	}
}

func TestRecorderForgetAndPending(t *testing.T) {
	t.Parallel()
	r := NewRecorder(&fakePDS{}, nil)
	q := check(Queued)
	q.Subject = forge.Subject{Event: "ev", Commit: "c"}
	r.Know("q", q)
	r.Know("done", check(Success))
	if !r.Pending("ev", "c") || r.Pending("ev", "other") {
		t.Error("Pending wrong")
	}
	if n := r.Forget(func(_ string, c forge.Check) bool { return c.Final() }); n != 1 {
		t.Errorf("forgot %d, want 1", n)
	}
	if _, ok := r.Get("done"); ok {
		t.Error("final check still known")
	}
}

func TestRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{invalid, true},
		{lexiconRefusal(t), true},
		{fmt.Errorf("write check k: %w", lexiconRefusal(t)), true},
		{&atclient.APIError{StatusCode: http.StatusBadRequest, Name: "ExpiredToken"}, false},
		{&atclient.APIError{StatusCode: http.StatusBadRequest, Name: "RateLimitExceeded"}, false},
		{&atclient.APIError{StatusCode: http.StatusInternalServerError}, false},
		{errDown, false},
	} {
		if got := Refused(tc.err); got != tc.want {
			t.Errorf("Refused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestMinimal(t *testing.T) {
	t.Parallel()
	c := check(Success)
	c.Steps = []forge.CheckStep{{Name: "x"}}
	m := Minimal(c, invalid)
	if m.Status != string(Error) || m.Steps != nil || m.FinishedAt == "" || m.CreatedAt != c.CreatedAt {
		t.Errorf("Minimal = %+v", m)
	}
}

// lexiconRefusal is the error pdsclient.Account.Put returns for a check the
// lexicon refuses before any request.
func lexiconRefusal(t *testing.T) error {
	t.Helper()
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	bad := check(Success)
	bad.Workflow = ""
	bad.Status = "no such status"
	_, err = cat.Encode(forge.CollectionCheck, bad)
	if !errors.Is(err, pdsclient.ErrInvalid) {
		t.Fatalf("Encode of an invalid check: %v, want pdsclient.ErrInvalid", err)
	}
	return err
}
