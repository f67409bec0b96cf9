package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	"github.com/bluesky-social/indigo/events/schedulers/sequential"
	"github.com/gorilla/websocket"
)

// Change is what a Source tells: records of a knotless collection
// changed in an account's repo, or a gap (a reconnect, an outdated
// cursor) after which anything may have changed.
type Change struct {
	Host       string
	DID        syntax.DID
	Collection string
	// Seq is the event's sequence number, for the cursor (0: none).
	Seq int64
	Gap bool
}

// Source is a stream of hints that records may have changed. Listing
// stays the truth: a Source only says when to list again.
type Source interface {
	Run(ctx context.Context, changed func(Change)) error
}

// Firehose follows com.atproto.sync.subscribeRepos of one host (a PDS or
// a relay), verifying each commit's signature against its account's key
// before trusting what it says.
type Firehose struct {
	Host string
	// Cursor is where to resume (0: from now).
	Cursor int64
	Dir    identity.Directory
	Logger *slog.Logger
	// Prefix selects the collections that matter (default dev.knotless.).
	Prefix string
	// Backoff is the first wait before a reconnect (default 1s); it
	// doubles up to 2 minutes while connections keep failing.
	Backoff time.Duration
}

// Run follows the stream until ctx ends, reconnecting with backoff; each
// (re)connection is reported as a gap.
func (f *Firehose) Run(ctx context.Context, changed func(Change)) error {
	if f.Prefix == "" {
		f.Prefix = "dev.knotless."
	}
	first := f.Backoff
	if first <= 0 {
		first = time.Second
	}
	backoff := first
	for {
		start := time.Now()
		err := f.once(ctx, changed)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(start) > time.Minute {
			backoff = first
		}
		f.Logger.Warn("event stream ended; reconnecting", "host", f.Host, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Minute)
	}
}

func (f *Firehose) once(ctx context.Context, changed func(Change)) error {
	u, err := url.Parse(strings.TrimSuffix(f.Host, "/") + "/xrpc/com.atproto.sync.subscribeRepos")
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	}
	if f.Cursor > 0 {
		u.RawQuery = "cursor=" + strconv.FormatInt(f.Cursor, 10)
	}
	con, _, err := websocket.DefaultDialer.DialContext(ctx, u.String(), http.Header{"User-Agent": []string{"knotless-run"}})
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", f.Host, err)
	}
	defer con.Close()
	// Closing the connection is what unblocks its reader when ctx ends;
	// the hook goes with this connection, not with ctx (a goroutine
	// waiting on ctx would outlive every reconnect).
	stop := context.AfterFunc(ctx, func() { con.Close() })
	defer stop()
	f.Logger.Info("following events", "host", f.Host, "cursor", f.Cursor)
	// Anything may have happened while not connected.
	changed(Change{Host: f.Host, Gap: true})
	cb := &events.RepoStreamCallbacks{
		RepoCommit: func(evt *comatproto.SyncSubscribeRepos_Commit) error {
			f.Cursor = evt.Seq
			var touched []string
			for _, op := range evt.Ops {
				if strings.HasPrefix(op.Path, f.Prefix) {
					touched = append(touched, strings.SplitN(op.Path, "/", 2)[0])
				}
			}
			if len(touched) == 0 {
				changed(Change{Host: f.Host, Seq: evt.Seq})
				return nil
			}
			if err := f.verify(ctx, evt); err != nil {
				f.Logger.Warn("commit does not verify; ignored", "host", f.Host, "did", evt.Repo, "seq", evt.Seq, "err", err)
				changed(Change{Host: f.Host, Seq: evt.Seq})
				return nil
			}
			did, _ := syntax.ParseDID(evt.Repo)
			for _, coll := range touched {
				changed(Change{Host: f.Host, DID: did, Collection: coll, Seq: evt.Seq})
			}
			return nil
		},
		RepoSync: func(evt *comatproto.SyncSubscribeRepos_Sync) error {
			f.Cursor = evt.Seq
			changed(Change{Host: f.Host, Seq: evt.Seq, Gap: true})
			return nil
		},
		RepoInfo: func(evt *comatproto.SyncSubscribeRepos_Info) error {
			if evt.Name == "OutdatedCursor" {
				changed(Change{Host: f.Host, Gap: true})
			}
			return nil
		},
	}
	sched := sequential.NewScheduler("knotless-"+f.Host, cb.EventHandler)
	return events.HandleRepoStream(ctx, con, sched, f.Logger)
}

// verify checks the commit's structure and its signature against the
// account's current key.
func (f *Firehose) verify(ctx context.Context, evt *comatproto.SyncSubscribeRepos_Commit) error {
	if _, err := repo.VerifyCommitMessage(ctx, evt); err != nil {
		return err
	}
	return repo.VerifyCommitSignature(ctx, f.Dir, evt)
}
