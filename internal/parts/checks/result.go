package checks

import (
	"mime"
	"net/http"
	"os"
	"path"
	"strings"
)

// Limits of what a check carries.
const (
	maxOutputs    = 16
	maxOutputSize = 1_000_000
)

// readImage reads an output file when it is an image small enough for a
// check; the type comes from the content, not the name alone.
func readImage(name string) ([]byte, string, bool) {
	fi, err := os.Lstat(name)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > maxOutputSize {
		return nil, "", false
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, "", false
	}
	sniffed := http.DetectContentType(data)
	if strings.HasPrefix(sniffed, "image/") {
		return data, sniffed, true
	}
	if byExt := mime.TypeByExtension(path.Ext(name)); byExt == "image/svg+xml" {
		return data, byExt, true
	}
	return nil, "", false
}
