package executor

import (
	"crypto/sha256"
	"encoding/hex"
)

// Label keys that every executor that labels its objects (Kubernetes
// Jobs, pods and policies; Docker containers, networks and volumes) puts
// on each object a run makes, so that a sweep finds a runner's objects.
const (
	// LabelRunner holds RunnerLabel of the runner's DID.
	LabelRunner = "dev.knotless.runner"
	// LabelRun holds the run id.
	LabelRun = "dev.knotless.run"
)

// RunnerLabel is the value of LabelRunner for a runner's DID: the first
// 20 hex digits of its SHA-256. A DID holds characters that neither a
// label value nor an object name may, and the value also goes into names
// (Docker's knotless-<runner>-<run>).
func RunnerLabel(did string) string {
	sum := sha256.Sum256([]byte(did))
	return hex.EncodeToString(sum[:10])
}
