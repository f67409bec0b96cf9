package run

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// idEncoding spells a run id's 80 bits: lowercase base32, no padding.
var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// NewID returns a new random run id: "r" and 16 lowercase base32
// characters (80 bits), safe as a label value and in a Kubernetes or
// Docker object name. A one-off run (`knotless-run run`) has one; a
// run the daemon drives has IDFor's.
func NewID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "r" + strings.ToLower(idEncoding.EncodeToString(b))
}

// IDFor is the id of the run of check key for runner: the first 80
// bits of sha256("run" "\n" runner "\n" key), spelt as NewID's. The
// check key comes from what caused the run (the event's record and
// commit, the control record or the schedule's tick, the workflow and
// the attempt: forge.AttemptKey), so the id does too, never from the
// process: every object of the run is named from it, and a second
// create of the same run fails (the fence: docs/design/daemon.md,
// "One run, one name").
// The runner is part of it: two runners a repository names run the
// same event each, in one namespace maybe.
func IDFor(runner, key string) string {
	sum := sha256.Sum256([]byte("run\n" + runner + "\n" + key))
	return "r" + strings.ToLower(idEncoding.EncodeToString(sum[:10]))
}
