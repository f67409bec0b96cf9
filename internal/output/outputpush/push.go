// Package outputpush is the runner's side of an output service: it
// pushes a run's output stream to the service with
// dev.knotless.putRunOutput (and its files with dev.knotless.putRunFile),
// outbound only, authenticated with atproto service-auth tokens from the
// runner's PDS. It reads the stream at its own pace: the run never waits
// for it, and after a failure it goes on from the offset the service
// acknowledged.
package outputpush

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"

	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
)

// TokenSource mints service-auth tokens: pdsclient.Account.ServiceAuth asks
// the runner's PDS (com.atproto.server.getServiceAuth).
type TokenSource interface {
	ServiceAuth(ctx context.Context, aud, lxm string, exp time.Time) (string, error)
}

// Config configures a Pusher.
type Config struct {
	// Service is the output service's base URL; ServiceDID its DID, the
	// tokens' audience.
	Service    string
	ServiceDID string
	Tokens     TokenSource
	HTTP       *http.Client
	Logger     *slog.Logger
	// MaxChunk is the most bytes of one put (default 256 KiB): the
	// pusher's memory per run.
	MaxChunk int
	// TokenTTL is how long a token is asked for (default 10 minutes, at
	// most an hour); one is used until a quarter of it is left.
	TokenTTL time.Duration
	// Backoff is the first wait after a failed put (default 250ms); it
	// doubles up to MaxBackoff (default 30s).
	Backoff, MaxBackoff time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Pusher pushes runs' output to one output service. It is safe for
// many runs at once.
type Pusher struct {
	cfg Config

	mu     sync.Mutex
	tokens map[tokenKey]token
}

// tokenKey is what a token is good for: the service binds a token to
// the method, check and run it is first used for.
type tokenKey struct{ lxm, check, run string }

type token struct {
	value string
	exp   time.Time
}

// New returns a Pusher.
func New(cfg Config) (*Pusher, error) {
	if cfg.Service == "" || cfg.ServiceDID == "" || cfg.Tokens == nil {
		return nil, errors.New("output pusher: the service's URL and DID and a token source are needed")
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: time.Minute}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxChunk <= 0 {
		cfg.MaxChunk = 256 << 10
	}
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = 10 * time.Minute
	}
	cfg.TokenTTL = min(cfg.TokenTTL, time.Hour)
	if cfg.Backoff <= 0 {
		cfg.Backoff = 250 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Pusher{cfg: cfg, tokens: map[tokenKey]token{}}, nil
}

// Push sends s to the service until the stream has ended and the
// service has all of it (nil), ctx ends (its error), or the service
// refuses the run for good (a *outputhttp.Error: the runner is not
// allowed, a later run replaced this one, ...). It starts from what the
// service has of the run (a successor's pusher after a handover goes on
// where its predecessor's stopped) and sends at most MaxChunk bytes a
// put; when it fell behind past what the stream keeps, it says so
// (cutFrom) and goes on from the kept tail. Its watch of the stream is
// one readers cannot take (output.Stream.WatchReserved).
func (p *Pusher) Push(ctx context.Context, s *output.Stream) error {
	// The pusher's watch is not a reader's: readers, however many, never
	// stop the push.
	signal, stop, err := s.WatchReserved()
	if err != nil {
		return fmt.Errorf("push output of %s: %w", s.Check(), err)
	}
	defer stop()
	log := p.cfg.Logger.With("check", s.Check(), "run", s.Run())
	backoff := p.cfg.Backoff
	acked := int64(-1) // not known yet
	failed := false
	for {
		var in output.PutInput
		if acked < 0 {
			// An empty put: the service makes the run if it has none,
			// and says how much of it it has.
			in = output.PutInput{Check: s.Check(), Run: s.Run(), Offset: 0}
		} else {
			rd, err := s.Read(acked, p.cfg.MaxChunk)
			if err != nil {
				return fmt.Errorf("push output of %s: %w", s.Check(), err)
			}
			in = output.PutInput{Check: s.Check(), Run: s.Run(), Offset: rd.Offset, Data: atdata.Bytes(rd.Data), Marks: output.ToWire(rd.Marks)}
			if rd.Offset > acked {
				from := acked
				in.CutFrom = &from
			}
			end := rd.Offset + int64(len(rd.Data))
			if rd.Final && end == rd.Size {
				in.Final, in.Status = true, rd.Status
			}
			if len(rd.Data) == 0 && in.CutFrom == nil && !in.Final {
				select {
				case <-signal:
					continue
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		out, err := p.put(ctx, in)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var xe *outputhttp.Error
			if errors.As(err, &xe) && permanent(xe) {
				return fmt.Errorf("push output of %s: %w", s.Check(), err)
			}
			if !failed {
				log.Warn("pushing output failed; trying again", "offset", in.Offset, "err", err, "in", backoff)
			}
			failed = true
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return ctx.Err()
			}
			backoff = min(2*backoff, p.cfg.MaxBackoff)
			continue
		}
		if failed {
			log.Info("pushing output again", "offset", out.Size)
			failed = false
		}
		backoff = p.cfg.Backoff
		acked = out.Size
		if out.Final {
			return nil
		}
	}
}

// permanent reports whether a refusal will not change by trying again:
// anything but an expired or refused token, a full service or a fault.
func permanent(e *outputhttp.Error) bool {
	switch e.Name {
	case "InvalidToken", "AuthenticationRequired", "TooManyTokens", "TooManyRuns":
		return false
	}
	return e.Status >= 400 && e.Status < 500 && e.Status != http.StatusTooManyRequests && e.Status != http.StatusRequestTimeout
}

func (p *Pusher) put(ctx context.Context, in output.PutInput) (output.PutOutput, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return output.PutOutput{}, err
	}
	var out output.PutOutput
	err = p.call(ctx, output.MethodPut, tokenKey{output.MethodPut, in.Check, in.Run}, nil, "application/json", bytes.NewReader(body), &out)
	return out, err
}

// PutFile sends one of a run's files; the run's output must have been
// put (Push has started). A path put again replaces the file.
func (p *Pusher) PutFile(ctx context.Context, check, run, path string, body io.ReadSeeker) (output.File, error) {
	var out output.File
	q := url.Values{"check": {check}, "run": {run}, "path": {path}}
	err := p.call(ctx, output.MethodPutFile, tokenKey{output.MethodPutFile, check, run}, q, "application/octet-stream", body, &out)
	if err != nil {
		return output.File{}, fmt.Errorf("put file %s of %s: %w", path, check, err)
	}
	return out, nil
}

// call makes one authenticated procedure call; a refused token is
// dropped and the call made once more with a new one.
func (p *Pusher) call(ctx context.Context, method string, key tokenKey, q url.Values, ctype string, body io.ReadSeeker, out any) error {
	for attempt := 0; ; attempt++ {
		tok, err := p.token(ctx, key)
		if err != nil {
			return err
		}
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			return err
		}
		u := strings.TrimSuffix(p.cfg.Service, "/") + "/xrpc/" + method
		if q != nil {
			u += "?" + q.Encode()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, body)
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := p.cfg.HTTP.Do(req)
		if err != nil {
			return err
		}
		if resp.StatusCode == http.StatusOK {
			err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out)
			resp.Body.Close()
			return err
		}
		xerr := outputhttp.ReadError(resp)
		resp.Body.Close()
		var xe *outputhttp.Error
		if attempt == 0 && errors.As(xerr, &xe) && (xe.Name == "InvalidToken" || xe.Name == "TokenReplayed") {
			p.drop(key)
			continue
		}
		return xerr
	}
}

// token returns a token for key, asking the PDS for a new one when none
// is cached or a quarter of its life is left.
func (p *Pusher) token(ctx context.Context, key tokenKey) (string, error) {
	now := p.cfg.Now()
	p.mu.Lock()
	t, ok := p.tokens[key]
	p.mu.Unlock()
	if ok && now.Add(p.cfg.TokenTTL/4).Before(t.exp) {
		return t.value, nil
	}
	exp := now.Add(p.cfg.TokenTTL)
	v, err := p.cfg.Tokens.ServiceAuth(ctx, p.cfg.ServiceDID, key.lxm, exp)
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, old := range p.tokens {
		if !now.Before(old.exp) {
			delete(p.tokens, k)
		}
	}
	p.tokens[key] = token{value: v, exp: exp}
	return v, nil
}

func (p *Pusher) drop(key tokenKey) {
	p.mu.Lock()
	delete(p.tokens, key)
	p.mu.Unlock()
}
