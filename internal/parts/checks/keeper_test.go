package checks

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/lib/backoff"
	"knotless.dev/run/internal/parts/state"
	"knotless.dev/run/internal/rules/work"
)

// fakeBlobs takes blobs and remembers their types.
type fakeBlobs struct {
	mu    sync.Mutex
	types []string
	err   error
}

func (f *fakeBlobs) UploadBlob(_ context.Context, mimeType string, data []byte) (atdata.Blob, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return atdata.Blob{}, f.err
	}
	f.types = append(f.types, mimeType)
	var ref atdata.CIDLink
	if err := ref.UnmarshalJSON([]byte(`{"$link":"bafkreibme22gw2h7y2h7tg2fhqotaqjucnbc24deqo72b6mkl2egezxhvy"}`)); err != nil {
		return atdata.Blob{}, err
	}
	return atdata.Blob{Ref: ref, MimeType: mimeType, Size: int64(len(data))}, nil
}

// keeper is a Keeper writing to pds, keeping its outbox in a real
// state.Store in a temporary directory.
func keeper(t *testing.T, pds *fakePDS) (*Keeper, *state.Store, *fakeBlobs) {
	t.Helper()
	st, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	blobs := &fakeBlobs{}
	k := NewKeeper(NewRecorder(pds, nil), Ports{Blobs: blobs, Outbox: st}, backoff.Policy{First: 2 * time.Second, Max: 5 * time.Minute}, nil)
	return k, st, blobs
}

func pushEvent(rkey string) work.Event {
	return work.Event{Kind: forge.KindPush, URI: syntax.ATURI("at://did:plc:owner/" + forge.CollectionRefUpdate + "/" + rkey),
		Repo:   forge.Record[forge.Repo]{URI: "at://did:plc:owner/" + forge.CollectionRepo + "/r"},
		Commit: "c" + rkey, Ref: "refs/heads/main", Trusted: true}
}

var quiet = slog.New(slog.DiscardHandler)

// A run's checks through the Keeper: queued once (a second queue of a
// queued check writes nothing, and keeps its creation time), running,
// then final from its result.
func TestKeeperLifecycle(t *testing.T) {
	t.Parallel()
	pds := &fakePDS{}
	k, _, blobs := keeper(t, pds)
	ctx := t.Context()
	ev := pushEvent("3k1")
	key := forge.CheckKey(ev.Subject(), "ci")
	c, err := k.Queued(ctx, key, ev, "ci", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	again, err := k.Queued(ctx, key, ev, "ci", 0, "")
	if err != nil || again.CreatedAt != c.CreatedAt {
		t.Fatalf("queued again: %+v, %v", again, err)
	}
	c = k.Running(ctx, key, c, time.Now(), quiet)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "plot.png"), []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "draw.svg"), []byte("<svg/>"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("text"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An image among the outputs that artifacts does not name is not
	// published.
	if err := os.WriteFile(filepath.Join(dir, "private.png"), []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), 0o600); err != nil {
		t.Fatal(err)
	}
	code := 0
	res := &run.Result{Status: run.Success, Log: []byte("log\n"), Outputs: []string{"plot.png", "notes.txt", "draw.svg", "missing.png", "private.png"},
		Artifacts: []string{"plot.png", "notes.txt", "draw.svg", "missing.png"},
		Steps:     []run.StepResult{{Name: "build", Status: run.Success, ExitCode: &code, Duration: time.Second}}}
	final := k.Finished(ctx, End{Key: key, Event: ev, Check: c, Result: res, OutDir: dir, Log: quiet})
	if diff := cmp.Diff([]string{key + " queued", key + " running", key + " success"}, pds.written); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	if final.Log == nil || len(final.Steps) != 1 || *final.Steps[0].ExitCode != 0 || final.Steps[0].DurationMs != 1000 {
		t.Errorf("final check %+v", final)
	}
	var paths []string
	for _, o := range final.Outputs {
		paths = append(paths, o.Path)
	}
	if diff := cmp.Diff([]string{"plot.png", "draw.svg"}, paths); diff != "" {
		t.Errorf("outputs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"text/plain", "image/png", "image/svg+xml"}, blobs.types); diff != "" {
		t.Errorf("blobs (-want +got):\n%s", diff)
	}
	if !k.Final(key) || k.Pending(ev) {
		t.Error("the finished check is not known final")
	}
}

// A blob that does not upload is left out; the check is written.
func TestKeeperMapWithoutBlobs(t *testing.T) {
	t.Parallel()
	k, _, blobs := keeper(t, &fakePDS{})
	blobs.err = errDown
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "plot.png"), []byte("\x89PNG\r\n\x1a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := k.Map(t.Context(), forge.Check{}, &run.Result{Status: run.Failure, Log: []byte("x"), Outputs: []string{"plot.png"}, Artifacts: []string{"plot.png"},
		FailedStep: strings.Repeat("é", 200), Error: "boom"}, dir, quiet)
	if c.Log != nil || len(c.Outputs) != 0 || c.Status != "failure" || len(c.FailedStep) > MaxName {
		t.Errorf("check %+v", c)
	}
}

// More image outputs than a check holds: the first maxOutputs are kept.
func TestKeeperMapBoundsOutputs(t *testing.T) {
	t.Parallel()
	k, _, _ := keeper(t, &fakePDS{})
	dir := t.TempDir()
	var outs []string
	for i := range maxOutputs + 2 {
		name := strings.Repeat("x", i+1) + ".png"
		if err := os.WriteFile(filepath.Join(dir, name), []byte("\x89PNG\r\n\x1a\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, name)
	}
	big := filepath.Join(dir, "big.png")
	if err := os.WriteFile(big, make([]byte, maxOutputSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	c := k.Map(t.Context(), forge.Check{}, &run.Result{Status: run.Success, Artifacts: append([]string{"big.png"}, outs...)}, dir, quiet)
	if len(c.Outputs) != maxOutputs || c.Outputs[0].Path != "x.png" {
		t.Errorf("%d outputs, first %v", len(c.Outputs), c.Outputs[0].Path)
	}
}

// Superseded, queued or running, and released: the statuses and errors
// the successor and the owner see.
func TestKeeperSupersededAndReleased(t *testing.T) {
	t.Parallel()
	pds := &fakePDS{}
	k, _, _ := keeper(t, pds)
	ctx := t.Context()
	ev := pushEvent("3k1")
	for _, wf := range []string{"queued", "running", "released"} {
		key := forge.CheckKey(ev.Subject(), wf)
		c, err := k.Queued(ctx, key, ev, wf, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		switch wf {
		case "queued":
			k.Superseded(ctx, End{Key: key, Event: ev, Check: c, By: "at://newer", Log: quiet})
		case "running":
			c = k.Running(ctx, key, c, time.Now(), quiet)
			k.Superseded(ctx, End{Key: key, Event: ev, Check: c, By: "at://newer", Result: &run.Result{Status: run.Cancelled}, Log: quiet})
		case "released":
			c = k.Running(ctx, key, c, time.Now(), quiet)
			k.Released(ctx, End{Key: key, Check: c, Result: &run.Result{Status: run.Cancelled, Log: []byte("so far")}, Log: quiet})
		}
	}
	for wf, want := range map[string]string{"queued": "cancelled superseded by at://newer", "running": "cancelled superseded by at://newer",
		"released": "queued released by a stopping runner: runs again on its successor"} {
		c, _ := k.Get(forge.CheckKey(ev.Subject(), wf))
		if got := c.Status + " " + c.Error; got != want {
			t.Errorf("%s: %q, want %q", wf, got, want)
		}
	}
	if !k.Pending(ev) {
		t.Error("the released check is final")
	}
}

// A failed write of the running check is logged; the run goes on with
// the check as it would be.
func TestKeeperRunningWriteFails(t *testing.T) {
	t.Parallel()
	k, _, _ := keeper(t, &fakePDS{})
	c := k.Running(t.Context(), "k", forge.Check{Status: "queued"}, time.Now(), quiet) // no queued check known: refused
	if c.Status != "running" || c.StartedAt == "" {
		t.Errorf("check %+v", c)
	}
}

// TestOwedCheckPaidLater: a final check the PDS does not take is kept
// in state.json and written when the PDS answers again; the work is
// done, never run again.
func TestOwedCheckPaidLater(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pds := &fakePDS{errs: []error{errDown, errDown}}
		k, st, _ := keeper(t, pds)
		ctx := t.Context()
		ev := pushEvent("3k1")
		k.Error(ctx, ev, "ci", "no")
		key := forge.CheckKey(ev.Subject(), "ci")
		if !st.IsOwed(key) {
			t.Fatal("the check is not owed in state.json")
		}
		if !k.Final(key) {
			t.Error("the owed check is not known final")
		}
		if wait := k.PayDue(ctx); wait <= 0 {
			t.Errorf("PayDue before the backoff: wait %s", wait)
		}
		time.Sleep(2 * time.Second)
		if wait := k.PayDue(ctx); wait <= 0 { // fails again: backs off
			t.Errorf("wait %s", wait)
		}
		if o := st.Owed()[key]; o.Tries != 2 {
			t.Errorf("tries = %d, want 2", o.Tries)
		}
		time.Sleep(time.Minute)
		k.PayDue(ctx)
		if st.IsOwed(key) {
			t.Error("still owed after the PDS took it")
		}
		if !st.Done(ev.Key()) {
			t.Error("the event is not done once its check is written")
		}
		if diff := cmp.Diff([]string{key + " error"}, pds.written); diff != "" {
			t.Errorf("writes (-want +got):\n%s", diff)
		}
	})
}

// PayOwed, the loop: woken by a check becoming owed, it pays it once the
// PDS takes writes again, and ends with its context.
func TestPayOwedLoop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		pds := &fakePDS{errs: []error{errDown}}
		k, st, _ := keeper(t, pds)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { k.PayOwed(ctx); close(done) }()
		ev := pushEvent("3k1")
		k.Error(ctx, ev, "ci", "no")
		synctest.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		if len(st.Owed()) != 0 {
			t.Errorf("owed %v after a minute", st.Owed())
		}
		cancel()
		<-done
	})
}

// A PDS that said when its rate limit resets is not tried before.
func TestOwedWaitsForTheRateLimit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		st, err := state.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		reset := time.Now().Add(time.Hour)
		var waited []time.Duration
		k := NewKeeper(NewRecorder(&fakePDS{errs: []error{errDown}}, nil), Ports{Blobs: &fakeBlobs{}, Outbox: st,
			LimitedUntil: func() time.Time { return reset }}, backoff.Policy{First: time.Second, Max: time.Minute}, quiet)
		k.OnWait(func(d time.Duration) { waited = append(waited, d) })
		k.Error(t.Context(), pushEvent("3k1"), "ci", "no")
		if wait := k.PayDue(t.Context()); wait < 59*time.Minute {
			t.Errorf("next try in %s, want at the reset, in an hour", wait)
		}
		// The wait is told (the metrics count it): once, an hour.
		if diff := cmp.Diff([]time.Duration{time.Hour}, waited); diff != "" {
			t.Errorf("waits told (-want +got):\n%s", diff)
		}
	})
}

func TestLoadOwedKnowsThemFinal(t *testing.T) {
	t.Parallel()
	k, st, _ := keeper(t, &fakePDS{})
	for key, o := range map[string]state.Owed{
		"good": {Check: []byte(`{"status":"success","workflow":"ci"}`), Event: "e@c"},
		"bad":  {Check: []byte(`"x"`)},
	} {
		if err := st.Owe(key, o); err != nil {
			t.Fatal(err)
		}
	}
	k.LoadOwed()
	if !k.Final("good") {
		t.Error("owed check not known final")
	}
	if st.IsOwed("bad") {
		t.Error("an unreadable owed check is kept")
	}
}

func TestRefusedTwiceIsFinalAllTheSame(t *testing.T) {
	t.Parallel()
	pds := &fakePDS{errs: []error{invalid, invalid}}
	k, st, _ := keeper(t, pds)
	ev := pushEvent("3k1")
	k.Error(t.Context(), ev, "ci", "no")
	key := forge.CheckKey(ev.Subject(), "ci")
	if c, ok := k.Get(key); !ok || c.Status != string(Error) {
		t.Errorf("known %+v, want a final error check", c)
	}
	if len(st.Owed()) != 0 {
		t.Error("a refused check is owed: it would be tried forever")
	}
	// Final already: a second error of the same work writes nothing.
	k.Error(t.Context(), ev, "ci", "again")
	if len(pds.written) != 0 {
		t.Errorf("writes %v, want none", pds.written)
	}
}

// A record the lexicon refuses before the write is replaced by a
// minimal error check: never owed, never retried.
func TestLexiconRefusalIsNotOwed(t *testing.T) {
	t.Parallel()
	k, st, _ := keeper(t, &fakePDS{errs: []error{lexiconRefusal(t)}})
	ev := pushEvent("3k1")
	k.Error(t.Context(), ev, "ci", "no")
	if len(st.Owed()) != 0 {
		t.Error("a check the lexicon refused is owed")
	}
	if c, _ := k.Get(forge.CheckKey(ev.Subject(), "ci")); c.Status != "error" || !strings.Contains(c.Error, "check record refused") {
		t.Errorf("check %+v, want the minimal error check", c)
	}
}

// A move the table refuses is logged, neither written nor owed.
func TestKeeperRefusedMoveIsNotOwed(t *testing.T) {
	t.Parallel()
	pds := &fakePDS{}
	k, st, _ := keeper(t, pds)
	ev := pushEvent("3k1")
	key := forge.CheckKey(ev.Subject(), "ci")
	k.Know(key, forge.Check{Status: "success"})
	k.Superseded(t.Context(), End{Key: key, Event: ev, By: "at://newer", Log: quiet})
	if len(pds.written) != 0 || len(st.Owed()) != 0 {
		t.Errorf("written %v, owed %v", pds.written, st.Owed())
	}
}

// TestVerdict: the checks of some work together.
func TestVerdict(t *testing.T) {
	t.Parallel()
	k, _, _ := keeper(t, &fakePDS{})
	s := pushEvent("3k1").Subject()
	know := func(wf, status, step string) {
		k.Know(forge.CheckKey(s, wf), forge.Check{Status: status, FailedStep: step})
	}
	know("ok", "success", "")
	know("going", "running", "")
	know("bad", "failure", "test")
	know("filtered", "skipped", "")
	for _, tc := range []struct {
		wfs    []string
		want   Verdict
		detail string
	}{
		{nil, Passed, ""},
		{[]string{"ok"}, Passed, ""},
		{[]string{"ok", "filtered"}, Passed, ""}, // its path filters left it out: passing
		{[]string{"filtered", "going"}, Waiting, ""},
		{[]string{"ok", "going"}, Waiting, ""},
		{[]string{"going", "unwritten"}, Unknown, ""},
		{[]string{"ok", "going", "bad"}, Failed, "workflow bad: failure in step test"},
	} {
		v, detail := k.Verdict(s, tc.wfs)
		if v != tc.want || detail != tc.detail {
			t.Errorf("%v: %v %q, want %v %q", tc.wfs, v, detail, tc.want, tc.detail)
		}
	}
}

// TestForget: final checks older than the retention are forgotten from
// memory; what is still listed work, owed, not final or recent stays.
func TestForget(t *testing.T) {
	t.Parallel()
	k, st, _ := keeper(t, &fakePDS{})
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	cutoff := now.Add(-30 * 24 * time.Hour)
	old, recent := now.Add(-40*24*time.Hour), now.Add(-time.Hour)
	ts := func(t time.Time) string { return t.Format(time.RFC3339Nano) }
	check := func(status string, ev string, finished time.Time) forge.Check {
		return forge.Check{Status: status, Subject: forge.Subject{Event: ev, Commit: "c"}, CreatedAt: ts(finished), FinishedAt: ts(finished)}
	}
	k.Know("old", check("success", "old", old))
	k.Know("listed", check("success", "listed", old))
	k.Know("running", check("running", "gone", old))
	k.Know("owed", check("failure", "gone", old))
	k.Know("recent", check("success", "recent", recent))
	if err := st.Owe("owed", state.Owed{}); err != nil {
		t.Fatal(err)
	}
	if n := k.Forget(cutoff, func(k string) bool { return k == "listed@c" }); n != 1 {
		t.Errorf("forgot %d checks, want 1", n)
	}
	for key, want := range map[string]bool{"old": false, "listed": true, "running": true, "owed": true, "recent": true} {
		if _, known := k.Get(key); known != want {
			t.Errorf("%s known %v, want %v", key, known, want)
		}
	}
}

// TestRateLimits: a 429 with Retry-After or ratelimit-reset is noted
// per host; other answers are not.
func TestRateLimits(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	limits := NewRateLimits()
	hc := limits.Client(srv.Client())
	if limits.Until(srv.URL) != (time.Time{}) {
		t.Fatal("limited before any answer")
	}
	resp, err := hc.Get(srv.URL + "/after")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if until := limits.Until(srv.URL + "/"); until.Before(time.Now().Add(time.Minute)) {
		t.Errorf("after Retry-After 120: limited until %s", until)
	}
	for _, tc := range []struct {
		status int
		h      http.Header
		ok     bool
	}{
		{http.StatusOK, http.Header{}, false},
		{http.StatusTooManyRequests, http.Header{"Retry-After": {"Wed, 21 Oct 2037 07:28:00 GMT"}}, true},
		{http.StatusOK, http.Header{"Ratelimit-Remaining": {"0"}, "Ratelimit-Reset": {"2000000000"}}, true},
		{http.StatusServiceUnavailable, http.Header{}, false},
		{http.StatusTooManyRequests, http.Header{"Retry-After": {"soon"}}, false},
	} {
		if _, ok := limitedUntil(tc.status, tc.h, time.Now()); ok != tc.ok {
			t.Errorf("%d %v: limited %v, want %v", tc.status, tc.h, ok, tc.ok)
		}
	}
}

// fakeLive is live output's answers, by check key.
type fakeLive struct {
	where map[string]*forge.LiveOutput
	files map[string][]forge.RunFile
}

func (f fakeLive) Where(key string) *forge.LiveOutput { return f.where[key] }
func (f fakeLive) Files(key string) []forge.RunFile   { return f.files[key] }

// With live output the running check says where its output is read, and
// the final one keeps that and lists the run's files kept there; a
// released check (queued again) lists none, and a run without a stream
// says nowhere.
func TestKeeperLiveOutput(t *testing.T) {
	t.Parallel()
	st, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ev, other := pushEvent("3k1"), pushEvent("3k2")
	key, none := forge.CheckKey(ev.Subject(), "ci"), forge.CheckKey(other.Subject(), "ci")
	where := &forge.LiveOutput{Service: "https://out.example", Page: "https://out.example/runs/did:plc:runner/" + key}
	files := []forge.RunFile{{Path: "report.txt", Size: 4}}
	live := fakeLive{where: map[string]*forge.LiveOutput{key: where}, files: map[string][]forge.RunFile{key: files}}
	k := NewKeeper(NewRecorder(&fakePDS{}, nil), Ports{Blobs: &fakeBlobs{}, Outbox: st, Live: live}, backoff.Policy{First: time.Second, Max: time.Minute}, nil)
	ctx := t.Context()

	c, err := k.Queued(ctx, key, ev, "ci", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	running := k.Running(ctx, key, c, time.Now(), quiet)
	if diff := cmp.Diff(where, running.Live); diff != "" {
		t.Errorf("running check's live (-want +got):\n%s", diff)
	}
	res := &run.Result{Status: run.Success, Log: []byte("log\n")}
	k.Released(ctx, End{Key: key, Check: running, Result: res, OutDir: t.TempDir(), Log: quiet})
	if got, _ := k.Get(key); got.Files != nil || got.Status != string(Queued) {
		t.Errorf("released check: status %s, files %v; want queued, none", got.Status, got.Files)
	}
	running = k.Running(ctx, key, c, time.Now(), quiet)
	final := k.Finished(ctx, End{Key: key, Event: ev, Check: running, Result: res, OutDir: t.TempDir(), Log: quiet})
	if diff := cmp.Diff(where, final.Live); diff != "" {
		t.Errorf("final check's live (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(files, final.Files); diff != "" {
		t.Errorf("final check's files (-want +got):\n%s", diff)
	}

	c, err = k.Queued(ctx, none, other, "ci", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := k.Running(ctx, none, c, time.Now(), quiet); got.Live != nil {
		t.Errorf("a run with no stream: live %+v, want none", got.Live)
	}
}
