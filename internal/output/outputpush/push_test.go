package outputpush_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/output/outputpush"
	"knotless.dev/run/internal/output/outputservice/servicetest"
)

const (
	serviceDID = "did:web:output.test"
	runnerDID  = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
	check      = "at://" + runnerDID + "/dev.knotless.check/zsvmur6bdrvdcvafwfoo7mmwp4"
)

// service runs the real output service, taking output from runners
// (servicetest); the PDS and PLC are the service's tests'.
func service(t *testing.T, runners ...string) (string, *servicetest.Tokens) {
	t.Helper()
	return servicetest.Start(t, servicetest.Config{ServiceDID: serviceDID, Runner: runnerDID, Runners: runners,
		Store: output.StoreConfig{Limits: output.Limits{Head: 1 << 20, Tail: 1 << 20}, MaxRunsPerRunner: 4, MaxFiles: 1, MaxFileBytes: 100, Retention: time.Hour}})
}

// A token is asked of the PDS once per check and run, and again only
// when a quarter of its life is left; the pusher's memory is one put.
func TestTokensLastUntilNearExpiry(t *testing.T) {
	t.Parallel()
	url, tokens := service(t, runnerDID)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p, err := outputpush.New(outputpush.Config{Service: url, ServiceDID: serviceDID, Tokens: tokens, MaxChunk: 10, TokenTTL: 8 * time.Minute, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	s := output.NewStream(check, "r", output.RunnerLimits())
	_, _ = s.Write([]byte(strings.Repeat("0123456789", 20))) // 20 puts of 10 bytes
	s.End("success")
	ctx := context.Background()
	if err := p.Push(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := p.Push(ctx, s); err != nil { // again: the service has it all
		t.Fatal(err)
	}
	if n := tokens.Count(); n != 1 {
		t.Errorf("%d tokens for one run's puts, want 1", n)
	}
	mu.Lock()
	now = now.Add(6*time.Minute + time.Second) // less than a quarter of 8 minutes left
	mu.Unlock()
	if err := p.Push(ctx, s); err != nil {
		t.Fatal(err)
	}
	if n := tokens.Count(); n != 2 {
		t.Errorf("%d tokens once the first neared its expiry, want 2", n)
	}
	if _, err := p.PutFile(ctx, check, "r", "a.txt", strings.NewReader("abc")); err != nil {
		t.Fatal(err)
	}
	s2 := output.NewStream(check, "r2", output.RunnerLimits())
	s2.End("success")
	if err := p.Push(ctx, s2); err != nil {
		t.Fatal(err)
	}
	if n := tokens.Count(); n != 4 {
		t.Errorf("%d tokens after a file and another run, want 4 (one per method and run)", n)
	}
	c := &outputhttp.Client{Base: url}
	if out, err := c.Get(ctx, check, 0, 0); err != nil || out.Run != "r2" || !out.Final {
		t.Errorf("the service has %+v, %v; want run r2, ended", out, err)
	}
}

// A refusal that trying again cannot change ends the push with it.
func TestPushEndsOnARefusal(t *testing.T) {
	t.Parallel()
	url, tokens := service(t, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa") // not this runner
	p, err := outputpush.New(outputpush.Config{Service: url, ServiceDID: serviceDID, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	s := output.NewStream(check, "r", output.RunnerLimits())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Push(ctx, s); !outputhttp.IsError(err, "RunnerNotAllowed") {
		t.Errorf("push of a runner the service does not take: %v", err)
	}
}

// Readers cannot stop a run's push: with every reader's place of the
// runner's hub taken, of the run and in all, the run's output still
// reaches the service.
func TestPushWithEveryReadersPlaceTaken(t *testing.T) {
	t.Parallel()
	url, tokens := service(t, runnerDID)
	p, err := outputpush.New(outputpush.Config{Service: url, ServiceDID: serviceDID, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	hub := output.NewHub(output.HubConfig{MaxSubscribers: 1})
	s, err := hub.Open(check, "r")
	if err != nil {
		t.Fatal(err)
	}
	_, stop, err := s.Watch()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, _, err := s.Watch(); !errors.Is(err, output.ErrTooManySubscribers) {
		t.Fatalf("a second reader of a hub of 1: %v", err)
	}
	_, _ = s.Write([]byte("pushed all the same\n"))
	s.End("success")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Push(ctx, s); err != nil {
		t.Fatal(err)
	}
	out, err := (&outputhttp.Client{Base: url}).Get(ctx, check, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if string(out.Data) != "pushed all the same\n" || !out.Final {
		t.Errorf("the service has %q, final %v", out.Data, out.Final)
	}
}
