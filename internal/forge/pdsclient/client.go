// Package pdsclient is the runner's client of atproto: public reads of
// any account's records from its PDS (found through the identity
// directory), the runner's own account (login, session, record writes,
// blobs, service auth), host listings, and the knotless lexicons every
// record read or written is validated against (Catalog). The records
// themselves are internal/forge's values.
package pdsclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
)

// Reader reads any account's public records from its PDS, found through
// the identity directory.
type Reader struct {
	Dir     identity.Directory
	Catalog *Catalog
	HTTP    *http.Client
	// Limits bound each listing (zero fields: the defaults). A PDS is
	// anyone's: one that never ends its cursor must not hold the caller.
	Limits ListLimits
}

// PDS returns the PDS host of did.
func (r *Reader) PDS(ctx context.Context, did syntax.DID) (string, error) {
	ident, err := r.Dir.LookupDID(ctx, did)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", did, err)
	}
	host := ident.PDSEndpoint()
	if host == "" {
		return "", fmt.Errorf("resolve %s: no PDS in its DID document", did)
	}
	return host, nil
}

func (r *Reader) client(ctx context.Context, did syntax.DID) (*atclient.APIClient, error) {
	host, err := r.PDS(ctx, did)
	if err != nil {
		return nil, err
	}
	c := atclient.NewAPIClient(host)
	if r.HTTP != nil {
		c.Client = r.HTTP
	}
	return c, nil
}

// Get reads one record and decodes it into v; it returns ErrNotFound
// when there is none.
func (r *Reader) Get(ctx context.Context, uri syntax.ATURI, v any) (string, error) {
	did, err := uri.Authority().AsDID()
	if err != nil {
		return "", fmt.Errorf("get %s: authority is not a DID", uri)
	}
	c, err := r.client(ctx, did)
	if err != nil {
		return "", err
	}
	return getRecord(ctx, c, r.Catalog, uri, v)
}

// ErrNotFound is returned for a record that does not exist.
var ErrNotFound = errors.New("record not found")

func getRecord(ctx context.Context, c *atclient.APIClient, cat *Catalog, uri syntax.ATURI, v any) (string, error) {
	coll := uri.Collection().String()
	out, err := agnostic.RepoGetRecord(ctx, c, "", coll, uri.Authority().String(), uri.RecordKey().String())
	if err != nil {
		var apiErr *atclient.APIError
		if errors.As(err, &apiErr) && (apiErr.Name == "RecordNotFound" || apiErr.StatusCode == http.StatusNotFound) {
			return "", fmt.Errorf("get %s: %w", uri, ErrNotFound)
		}
		return "", fmt.Errorf("get %s: %w", uri, err)
	}
	if out.Value == nil {
		return "", fmt.Errorf("get %s: %w", uri, ErrNotFound)
	}
	if out.Uri != uri.String() {
		// A PDS answers for the account asked for, with the record
		// asked for; anything else is not that record.
		return "", fmt.Errorf("get %s: the PDS answered with another record, %s", uri, out.Uri)
	}
	if err := cat.Decode(coll, *out.Value, v); err != nil {
		return "", fmt.Errorf("get %s: %w", uri, err)
	}
	cid := ""
	if out.Cid != nil {
		cid = *out.Cid
	}
	return cid, nil
}

// List reads the records of collection in did's repo, validated and
// decoded; records that do not validate are returned apart, and so are
// entries the PDS lists under another account or collection than the
// one asked for (a PDS cannot speak for another account). A listing
// that reaches r.Limits stops there: it returns what it read so far
// with a *BoundError.
func List[T any](ctx context.Context, r *Reader, did syntax.DID, collection string) ([]forge.Record[T], []forge.Invalid, error) {
	c, err := r.client(ctx, did)
	if err != nil {
		return nil, nil, err
	}
	return list[T](ctx, c, r.Catalog, did, collection, r.Limits.orDefaults(), "")
}

// ListSince is List of a collection whose record keys are TIDs (the
// time of the record's writing), read only as far back as since: a PDS
// lists records by descending key, and the listing stops after the
// first page that reaches a key older than since, so the account's
// history before it costs no page. Older records on that page are
// returned too.
func ListSince[T any](ctx context.Context, r *Reader, did syntax.DID, collection string, since time.Time) ([]forge.Record[T], []forge.Invalid, error) {
	c, err := r.client(ctx, did)
	if err != nil {
		return nil, nil, err
	}
	return list[T](ctx, c, r.Catalog, did, collection, r.Limits.orDefaults(), syntax.NewTID(since.UnixMicro(), 0).String())
}

// ListLimits bound one listing: all the pages of one collection of one
// account (List), or of a host's accounts (ListRepos). Time is the
// caller's to bound, through ctx.
type ListLimits struct {
	// Pages is the most pages read (default DefaultListPages), Records
	// the most entries (default DefaultListRecords); below zero: none.
	Pages   int
	Records int
}

// Default bounds of a listing: 100 pages of 100 records. A legitimate
// account with more records than that is listed newest first (a PDS
// lists records by descending key), so the newest work is kept.
const (
	DefaultListPages   = 100
	DefaultListRecords = 10_000
)

func (l ListLimits) orDefaults() ListLimits {
	if l.Pages == 0 {
		l.Pages = DefaultListPages
	}
	if l.Records == 0 {
		l.Records = DefaultListRecords
	}
	return l
}

// unbounded lists all: the runner's own records, on its operator's PDS.
var unbounded = ListLimits{Pages: -1, Records: -1}

// bound is the bound a listing reaches with pages pages read and n
// entries taken, or nil.
func (l ListLimits) bound(host, what string, pages, n int) *BoundError {
	switch {
	case l.Records >= 0 && n >= l.Records:
		return &BoundError{Host: host, What: what, Bound: "records", Limit: l.Records}
	case l.Pages >= 0 && pages >= l.Pages:
		return &BoundError{Host: host, What: what, Bound: "pages", Limit: l.Pages}
	}
	return nil
}

// BoundError is a listing stopped at one of its ListLimits; what was
// read up to there comes with it.
type BoundError struct {
	// Host is the PDS (or relay) listed, What the listing (a
	// collection of an account, or a host's accounts).
	Host, What string
	// Bound is "pages" or "records", Limit its value.
	Bound string
	Limit int
}

func (e *BoundError) Error() string {
	return fmt.Sprintf("list %s on %s: stopped at the bound of %d %s; the rest is not read", e.What, e.Host, e.Limit, e.Bound)
}

// A listing with stopBelow (a record key) ends after the page whose last
// key sorts below it.
func list[T any](ctx context.Context, c *atclient.APIClient, cat *Catalog, did syntax.DID, collection string, lim ListLimits, stopBelow string) ([]forge.Record[T], []forge.Invalid, error) {
	var recs []forge.Record[T]
	var bad []forge.Invalid
	what := collection + " of " + did.String()
	cursor := ""
	for pages := 1; ; pages++ {
		out, err := agnostic.RepoListRecords(ctx, c, collection, cursor, 100, did.String(), false)
		if err != nil {
			return nil, nil, fmt.Errorf("list %s of %s: %w", collection, did, err)
		}
		for _, rec := range out.Records {
			if lim.Records >= 0 && len(recs)+len(bad) >= lim.Records {
				return recs, bad, lim.bound(c.Host, what, pages, len(recs)+len(bad))
			}
			uri, err := syntax.ParseATURI(rec.Uri)
			if err != nil || rec.Value == nil {
				bad = append(bad, forge.Invalid{URI: syntax.ATURI(rec.Uri), Err: fmt.Errorf("malformed listing entry")})
				continue
			}
			if err := listedAs(uri, did, collection); err != nil {
				bad = append(bad, forge.Invalid{URI: uri, Err: err})
				continue
			}
			var v T
			if err := cat.Decode(collection, *rec.Value, &v); err != nil {
				bad = append(bad, forge.Invalid{URI: uri, Err: err})
				continue
			}
			recs = append(recs, forge.Record[T]{URI: uri, CID: rec.Cid, Value: v})
		}
		if out.Cursor == nil || *out.Cursor == "" || len(out.Records) == 0 {
			return recs, bad, nil
		}
		if stopBelow != "" {
			if last, err := syntax.ParseATURI(out.Records[len(out.Records)-1].Uri); err == nil && last.RecordKey().String() < stopBelow {
				return recs, bad, nil
			}
		}
		if err := lim.bound(c.Host, what, pages, len(recs)+len(bad)); err != nil {
			return recs, bad, err
		}
		cursor = *out.Cursor
	}
}

// listedAs checks that a listed record's URI is one of the records
// asked for: did's repo, collection, a valid record key.
func listedAs(uri syntax.ATURI, did syntax.DID, collection string) error {
	if uri.Authority().String() != did.String() {
		return fmt.Errorf("listed as %s's record, but its authority is %s: dropped", did, uri.Authority())
	}
	if uri.Collection().String() != collection {
		return fmt.Errorf("listed as a %s record, but its collection is %s: dropped", collection, uri.Collection())
	}
	if _, err := syntax.ParseRecordKey(uri.RecordKey().String()); err != nil {
		return fmt.Errorf("listed record has no valid record key: dropped")
	}
	return nil
}

// ListRepos lists the DIDs of the accounts hosted on a PDS (or relay),
// within lim (zero fields: the defaults); a listing that reaches it
// returns what it read with a *BoundError.
func ListRepos(ctx context.Context, hc *http.Client, host string, lim ListLimits) ([]syntax.DID, error) {
	lim = lim.orDefaults()
	c := atclient.NewAPIClient(host)
	if hc != nil {
		c.Client = hc
	}
	var dids []syntax.DID
	n := 0
	cursor := ""
	for pages := 1; ; pages++ {
		params := map[string]any{"limit": 1000}
		if cursor != "" {
			params["cursor"] = cursor
		}
		var out struct {
			Cursor string `json:"cursor"`
			Repos  []struct {
				Did    string `json:"did"`
				Active *bool  `json:"active"`
			} `json:"repos"`
		}
		if err := c.Get(ctx, "com.atproto.sync.listRepos", params, &out); err != nil {
			return nil, fmt.Errorf("list repos of %s: %w", host, err)
		}
		for _, r := range out.Repos {
			if lim.Records >= 0 && n >= lim.Records {
				return dids, lim.bound(host, "the accounts", pages, n)
			}
			n++
			if r.Active != nil && !*r.Active {
				continue
			}
			if d, err := syntax.ParseDID(r.Did); err == nil {
				dids = append(dids, d)
			}
		}
		if out.Cursor == "" || len(out.Repos) == 0 {
			return dids, nil
		}
		if err := lim.bound(host, "the accounts", pages, n); err != nil {
			return dids, err
		}
		cursor = out.Cursor
	}
}

// Account is the runner's own account: it writes checks and uploads
// blobs.
type Account struct {
	api     *atclient.APIClient
	did     syntax.DID
	catalog *Catalog
}

// LoginConfig says how to log the runner in.
type LoginConfig struct {
	// Host is the runner's PDS URL.
	Host string
	// Identifier is the runner's DID (or handle).
	Identifier string
	// Password is an app password.
	Password string
	// Session, when set, is resumed instead of logging in anew; a session
	// the PDS refuses falls back to the password.
	Session *forge.Session
	// OnSession is called with the session after login and after each
	// token refresh, to persist it. It must return quickly.
	OnSession func(forge.Session)
	HTTP      *http.Client
}

// ErrNoPassword is Login's error when it has neither an app password
// nor a saved session that still works.
var ErrNoPassword = errors.New("log in: no app password and no usable saved session")

// Login logs the runner in, resuming a saved session when it still
// works.
func Login(ctx context.Context, cfg LoginConfig, cat *Catalog) (*Account, bool, error) {
	cb := func(_ context.Context, s atclient.PasswordSessionData) {
		if cfg.OnSession != nil {
			cfg.OnSession(forge.Session(s))
		}
	}
	if cfg.Session != nil && cfg.Session.RefreshToken != "" && (cfg.Host == "" || strings.TrimSuffix(cfg.Host, "/") == strings.TrimSuffix(cfg.Session.Host, "/")) {
		c := atclient.ResumePasswordSession(atclient.PasswordSessionData(*cfg.Session), cb)
		if cfg.HTTP != nil {
			c.Client = cfg.HTTP
		}
		// A refresh proves the saved session is still good and gives
		// fresh tokens; a refused one falls back to the password.
		if pa, ok := c.Auth.(*atclient.PasswordAuth); ok {
			if err := pa.Refresh(ctx, c.Client, ""); err == nil {
				return &Account{api: c, did: cfg.Session.AccountDID, catalog: cat}, true, nil
			}
		}
	}
	if cfg.Password == "" {
		return nil, false, ErrNoPassword
	}
	c, err := atclient.LoginWithPasswordHost(ctx, cfg.Host, cfg.Identifier, cfg.Password, "", cb)
	if err != nil {
		return nil, false, fmt.Errorf("log in to %s as %s: %w", cfg.Host, cfg.Identifier, err)
	}
	if cfg.HTTP != nil {
		c.Client = cfg.HTTP
	}
	if cfg.OnSession != nil {
		if pa, ok := c.Auth.(*atclient.PasswordAuth); ok {
			cfg.OnSession(forge.Session(pa.Session.Clone()))
		}
	}
	return &Account{api: c, did: *c.AccountDID, catalog: cat}, false, nil
}

// Resume makes an account of a saved session without asking the PDS
// anything: the access token is refreshed when the PDS says it has
// expired, and onSession (when set) is called with the refreshed
// session to persist it.
func Resume(s forge.Session, onSession func(forge.Session), cat *Catalog, hc *http.Client) *Account {
	c := atclient.ResumePasswordSession(atclient.PasswordSessionData(s), func(_ context.Context, s atclient.PasswordSessionData) {
		if onSession != nil {
			onSession(forge.Session(s))
		}
	})
	if hc != nil {
		c.Client = hc
	}
	return &Account{api: c, did: s.AccountDID, catalog: cat}
}

// Logout ends the account's session on its PDS (deleteSession with the
// refresh token).
func (a *Account) Logout(ctx context.Context) error {
	pa, ok := a.api.Auth.(*atclient.PasswordAuth)
	if !ok {
		return errors.New("log out: not a password session")
	}
	if err := pa.Logout(ctx, a.api.Client); err != nil {
		return fmt.Errorf("log out of %s: %w", a.api.Host, err)
	}
	return nil
}

// DID is the account's DID.
func (a *Account) DID() syntax.DID { return a.did }

// Host is the account's PDS URL.
func (a *Account) Host() string { return a.api.Host }

// Put writes a record of collection at rkey, validated first.
func (a *Account) Put(ctx context.Context, collection, rkey string, v any) (syntax.ATURI, error) {
	rec, err := a.catalog.Encode(collection, v)
	if err != nil {
		return "", err
	}
	validate := false // the PDS does not know knotless lexicons; we validated
	out, err := agnostic.RepoPutRecord(ctx, a.api, &agnostic.RepoPutRecord_Input{
		Collection: collection,
		Repo:       a.did.String(),
		Rkey:       rkey,
		Record:     rec,
		Validate:   &validate,
	})
	if err != nil {
		return "", fmt.Errorf("put %s/%s: %w", collection, rkey, err)
	}
	return syntax.ATURI(out.Uri), nil
}

// Write is one record of a PutSwap or PutBatch: Value at
// Collection/Rkey, which does not exist yet when New is set and does
// otherwise. Prev, when set, is the CID the record must have for the
// write to be made (PutSwap's compare-and-swap).
type Write struct {
	Collection, Rkey string
	Value            any
	New              bool
	Prev             string
}

// Written is what a write made: the record's new CID (a batch's: one a
// write, in order) and the repository's commit after it.
type Written struct {
	CIDs   []string
	Commit string
}

// ErrSwapLost is a compare-and-swap write the PDS did not make: the
// record (or, for a batch, the repository) was not as the write
// expected — another writer went first.
var ErrSwapLost = errors.New("lost the compare-and-swap: another writer changed the record")

// swapError maps the PDS's InvalidSwap answer to ErrSwapLost.
func swapError(err error) error {
	var ae *atclient.APIError
	if errors.As(err, &ae) && ae.Name == "InvalidSwap" {
		return fmt.Errorf("%w (%v)", ErrSwapLost, err)
	}
	return err
}

// putSwapInput is putRecord's input with swapRecord always sent: null
// when the record must not exist (the generated type leaves a nil one
// out, which would write blindly).
type putSwapInput struct {
	Collection string         `json:"collection"`
	Record     map[string]any `json:"record"`
	Repo       string         `json:"repo"`
	Rkey       string         `json:"rkey"`
	SwapRecord *string        `json:"swapRecord"`
	Validate   bool           `json:"validate"`
}

// PutSwap writes w as a compare-and-swap (putRecord with swapRecord):
// only if the record does not exist (w.New) or has the CID w.Prev. A
// write that finds the record otherwise fails with ErrSwapLost and
// writes nothing. A write that is neither New nor has Prev is refused
// here: that would be a blind write.
func (a *Account) PutSwap(ctx context.Context, w Write) (Written, error) {
	if !w.New && w.Prev == "" {
		return Written{}, fmt.Errorf("put %s/%s: a compare-and-swap update needs the record's CID", w.Collection, w.Rkey)
	}
	rec, err := a.catalog.Encode(w.Collection, w.Value)
	if err != nil {
		return Written{}, err
	}
	in := putSwapInput{Collection: w.Collection, Record: rec, Repo: a.did.String(), Rkey: w.Rkey}
	if !w.New {
		in.SwapRecord = &w.Prev
	}
	var out agnostic.RepoPutRecord_Output
	if err := a.api.Post(ctx, "com.atproto.repo.putRecord", in, &out); err != nil {
		return Written{}, fmt.Errorf("put %s/%s: %w", w.Collection, w.Rkey, swapError(err))
	}
	written := Written{CIDs: []string{out.Cid}}
	if out.Commit != nil {
		written.Commit = out.Commit.Cid
	}
	return written, nil
}

// PutBatch writes records in one commit of the account's repository
// (com.atproto.repo.applyWrites): all or none. A PDS makes one commit
// of a repository at a time, so writes sent together wait for one
// commit, not one each. Unlike Put, each write must say whether its
// record is new: the PDS refuses to create a record that exists or to
// update one that does not, and so refuses the batch. On a hosted PDS
// a created record costs 3 write points, an updated one 2 (Put: 2).
//
// With swapCommit set, the batch is a compare-and-swap of the whole
// repository: made only if its commit is still swapCommit (nothing was
// written since), else ErrSwapLost. applyWrites has no per-record swap;
// a repository that has not moved since the writer learnt its records'
// CIDs holds them at those CIDs.
func (a *Account) PutBatch(ctx context.Context, writes []Write, swapCommit string) (Written, error) {
	validate := false // as in Put
	in := &agnostic.RepoApplyWrites_Input{Repo: a.did.String(), Validate: &validate}
	if swapCommit != "" {
		in.SwapCommit = &swapCommit
	}
	for _, w := range writes {
		rec, err := a.catalog.Encode(w.Collection, w.Value)
		if err != nil {
			return Written{}, err
		}
		raw, err := json.Marshal(rec)
		if err != nil {
			return Written{}, fmt.Errorf("encode %s/%s: %w", w.Collection, w.Rkey, err)
		}
		value := json.RawMessage(raw)
		if w.New {
			in.Writes = append(in.Writes, &agnostic.RepoApplyWrites_Input_Writes_Elem{RepoApplyWrites_Create: &agnostic.RepoApplyWrites_Create{
				Collection: w.Collection, Rkey: &w.Rkey, Value: &value}})
		} else {
			in.Writes = append(in.Writes, &agnostic.RepoApplyWrites_Input_Writes_Elem{RepoApplyWrites_Update: &agnostic.RepoApplyWrites_Update{
				Collection: w.Collection, Rkey: w.Rkey, Value: &value}})
		}
	}
	out, err := agnostic.RepoApplyWrites(ctx, a.api, in)
	if err != nil {
		return Written{}, fmt.Errorf("write %d records in one commit: %w", len(writes), swapError(err))
	}
	var written Written
	if out.Commit != nil {
		written.Commit = out.Commit.Cid
	}
	for _, r := range out.Results {
		switch {
		case r.RepoApplyWrites_CreateResult != nil:
			written.CIDs = append(written.CIDs, r.RepoApplyWrites_CreateResult.Cid)
		case r.RepoApplyWrites_UpdateResult != nil:
			written.CIDs = append(written.CIDs, r.RepoApplyWrites_UpdateResult.Cid)
		}
	}
	if len(written.CIDs) != len(writes) {
		// Written, but the CIDs are unknown: the next write of each
		// reads its record first.
		written.CIDs = nil
	}
	return written, nil
}

// Create writes a record of collection under a new TID key.
func (a *Account) Create(ctx context.Context, collection string, v any) (syntax.ATURI, error) {
	return a.Put(ctx, collection, syntax.NewTIDNow(0).String(), v)
}

// Get reads one of the account's own records.
func (a *Account) Get(ctx context.Context, collection, rkey string, v any) (string, error) {
	uri := syntax.ATURI(fmt.Sprintf("at://%s/%s/%s", a.did, collection, rkey))
	return getRecord(ctx, a.api, a.catalog, uri, v)
}

// Delete removes one of the account's own records.
func (a *Account) Delete(ctx context.Context, collection, rkey string) error {
	body := map[string]any{"repo": a.did.String(), "collection": collection, "rkey": rkey}
	if err := a.api.Post(ctx, "com.atproto.repo.deleteRecord", body, nil); err != nil {
		return fmt.Errorf("delete %s/%s: %w", collection, rkey, err)
	}
	return nil
}

// ListOwn lists the account's own records of collection.
func ListOwn[T any](ctx context.Context, a *Account, collection string) ([]forge.Record[T], []forge.Invalid, error) {
	return list[T](ctx, a.api, a.catalog, a.did, collection, unbounded, "")
}

// UploadBlob uploads data with an explicit content type and returns the
// blob reference for a record.
func (a *Account) UploadBlob(ctx context.Context, mimeType string, data []byte) (atdata.Blob, error) {
	req := atclient.NewAPIRequest(atclient.MethodProcedure, "com.atproto.repo.uploadBlob", bytes.NewReader(data))
	req.Headers.Set("Content-Type", mimeType)
	resp, err := a.api.Do(ctx, req)
	if err != nil {
		return atdata.Blob{}, fmt.Errorf("upload blob: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var eb atclient.ErrorBody
		if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
			return atdata.Blob{}, fmt.Errorf("upload blob: HTTP %d", resp.StatusCode)
		}
		return atdata.Blob{}, fmt.Errorf("upload blob: %w", eb.APIError(resp.StatusCode))
	}
	var out struct {
		Blob atdata.Blob `json:"blob"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return atdata.Blob{}, fmt.Errorf("upload blob: decode response: %w", err)
	}
	return out.Blob, nil
}

// MaxBlob is the most bytes GetBlob reads: a PDS's own bound on a blob
// (the reference PDS takes 5 MB), so a hostile one cannot make a
// reader take more.
const MaxBlob = 5 << 20

// GetBlob downloads a blob of did (a check's log, for tools and tests),
// at most MaxBlob bytes.
func (r *Reader) GetBlob(ctx context.Context, did syntax.DID, cid string) ([]byte, error) {
	c, err := r.client(ctx, did)
	if err != nil {
		return nil, err
	}
	req := atclient.NewAPIRequest(atclient.MethodQuery, "com.atproto.sync.getBlob", nil)
	req.QueryParams.Set("did", did.String())
	req.QueryParams.Set("cid", cid)
	resp, err := c.Do(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("get blob %s: %w", cid, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get blob %s: HTTP %d", cid, resp.StatusCode)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, MaxBlob+1)); err != nil {
		return nil, fmt.Errorf("get blob %s: %w", cid, err)
	}
	if buf.Len() > MaxBlob {
		return nil, fmt.Errorf("get blob %s: more than %d bytes", cid, MaxBlob)
	}
	return buf.Bytes(), nil
}

// ServiceAuth asks the account's PDS for an atproto service-auth token
// (com.atproto.server.getServiceAuth): signed with the account's key,
// for the service whose DID is aud, good for the method lxm only, until
// exp (a PDS refuses an exp more than an hour away).
func (a *Account) ServiceAuth(ctx context.Context, aud, lxm string, exp time.Time) (string, error) {
	var out struct {
		Token string `json:"token"`
	}
	params := map[string]any{"aud": aud, "lxm": lxm, "exp": exp.Unix()}
	if err := a.api.Get(ctx, "com.atproto.server.getServiceAuth", params, &out); err != nil {
		return "", fmt.Errorf("get service auth for %s (%s): %w", aud, lxm, err)
	}
	if out.Token == "" {
		return "", fmt.Errorf("get service auth for %s (%s): the PDS answered without a token", aud, lxm)
	}
	return out.Token, nil
}
