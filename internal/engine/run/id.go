package run

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// NewID returns a new random run id: "r" and 16 lowercase base32
// characters (80 bits), safe as a label value and in a Kubernetes or
// Docker object name.
func NewID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "r" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}
