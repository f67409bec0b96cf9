package forge

import (
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Record is one record read from a repo, decoded and validated.
type Record[T any] struct {
	URI   syntax.ATURI
	CID   string
	Value T
}

// Invalid is a record that did not validate against its lexicon; it is
// skipped, and the caller decides whether to tell.
type Invalid struct {
	URI syntax.ATURI
	Err error
}

func (i Invalid) Error() string { return fmt.Sprintf("%s: %v", i.URI, i.Err) }

// Session is the runner's password session on its PDS, persisted in
// state.json and resumed at the next start (pdsclient.Login). Its JSON
// is indigo's atclient.PasswordSessionData's.
type Session struct {
	AccessToken  string     `json:"access_token"`
	RefreshToken string     `json:"refresh_token"`
	AccountDID   syntax.DID `json:"account_did"`
	Host         string     `json:"host"`
}
