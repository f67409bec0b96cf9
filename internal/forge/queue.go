package forge

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// The merge queue's collections.
const (
	CollectionQueueEntry = "dev.knotless.queueEntry"
	CollectionBatch      = "dev.knotless.batch"
	CollectionEjection   = "dev.knotless.ejection"
	CollectionLanding    = "dev.knotless.landing"
)

// Batch statuses.
const (
	BatchBuilding = "building"
	BatchRunning  = "running"
	BatchLanded   = "landed"
	BatchFailed   = "failed"
	BatchRebuilt  = "rebuilt"
)

// Ejection reasons.
const (
	EjectConflictBase = "conflictBase"
	EjectConflictPull = "conflictPull"
	EjectPreflight    = "preflight"
	EjectBatch        = "batch"
	EjectHeadMoved    = "headMoved"
	EjectClosed       = "closed"
	// EjectBaseChanged: the pull's base is not the branch the queue
	// entry approved.
	EjectBaseChanged = "baseChanged"
	// EjectNoBase: the queue entry names no base branch.
	EjectNoBase = "noBase"
	// EjectNotLander: the repository's landers do not name the runner
	// that lands its queue, so it may not push.
	EjectNotLander = "notLander"
)

// KindBatch is the subject kind of a batch's checks (untrusted, like a
// pull's).
const KindBatch = "batch"

// QueueEntry is a dev.knotless.queueEntry record: the owner queued a pull
// at the head commit and onto the base branch it approved.
type QueueEntry struct {
	Type   string `json:"$type"`
	Repo   string `json:"repo"`
	Pull   string `json:"pull"`
	Commit string `json:"commit"`
	// Base is the branch name the pull is approved onto; an entry
	// without one is ejected (EjectNoBase).
	Base      string `json:"base,omitempty"`
	CreatedAt string `json:"createdAt"`
}

// Batch is a dev.knotless.batch record, written by the lander.
type Batch struct {
	Type      string      `json:"$type"`
	Repo      string      `json:"repo"`
	Ref       string      `json:"ref"`
	Base      string      `json:"base"`
	Pulls     []BatchPull `json:"pulls"`
	Squashed  string      `json:"squashed,omitempty"`
	Status    string      `json:"status"`
	Error     string      `json:"error,omitempty"`
	CreatedAt string      `json:"createdAt"`
}

// BatchPull is one pull of a batch, at its approved commit.
type BatchPull struct {
	Pull   string `json:"pull"`
	Commit string `json:"commit"`
}

// Ejection is a dev.knotless.ejection record: a pull left the queue, and
// why.
type Ejection struct {
	Type      string `json:"$type"`
	Repo      string `json:"repo"`
	Pull      string `json:"pull"`
	Commit    string `json:"commit"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail,omitempty"`
	Batch     string `json:"batch,omitempty"`
	CreatedAt string `json:"createdAt"`
}

// Landing is a dev.knotless.landing record: the lander pushed ref from
// Old to New.
type Landing struct {
	Type      string `json:"$type"`
	Repo      string `json:"repo"`
	Ref       string `json:"ref"`
	Old       string `json:"old"`
	New       string `json:"new"`
	Batch     string `json:"batch"`
	CreatedAt string `json:"createdAt"`
}

// Lander is the runner of the repository that lands its merge queue: the
// first runner in Runners that is also in Landers, else the first in
// Runners, else none ("").
func (r *Repo) Lander() string {
	for _, d := range r.Runners {
		for _, l := range r.Landers {
			if d == l {
				return d
			}
		}
	}
	if len(r.Runners) > 0 {
		return r.Runners[0]
	}
	return ""
}

// MayLand reports whether the owner granted did the push (Landers names
// it).
func (r *Repo) MayLand(did string) bool {
	for _, d := range r.Landers {
		if d == did {
			return true
		}
	}
	return false
}

// BatchKey is the record key of the batch of pulls on base in repo: the
// first 16 bytes of sha256("batch" "\n" repo "\n" base "\n" (pull " "
// commit "\n")...), unpadded lower-case base32.
func BatchKey(repo, base string, pulls []BatchPull) string {
	var b strings.Builder
	b.WriteString("batch\n" + repo + "\n" + base + "\n")
	for _, p := range pulls {
		b.WriteString(p.Pull + " " + p.Commit + "\n")
	}
	return key(b.String())
}

// EjectionKey is the record key of the ejection of pull at commit.
func EjectionKey(pull, commit string) string {
	return key("ejection\n" + pull + "\n" + commit)
}

// LandingKey is the record key of the landing of the batch whose key is
// batchKey and whose createdAt is batchCreated: a TID (landings are
// pushes, and events sort by TID) of the batch's creation time, its
// clock id the batch key's first 10 bits, so that the same batch always
// has the same landing key.
func LandingKey(batchKey, batchCreated string) (string, error) {
	t, err := syntax.ParseDatetimeLenient(batchCreated)
	if err != nil {
		return "", fmt.Errorf("landing key: batch createdAt: %w", err)
	}
	h := sha256.Sum256([]byte(batchKey))
	clock := uint(h[0])<<2 | uint(h[1])>>6
	return syntax.NewTID(t.Time().UnixMicro(), clock).String(), nil
}

func key(s string) string {
	h := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:16]))
}
