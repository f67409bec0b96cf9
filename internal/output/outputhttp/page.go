package outputhttp

import (
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"regexp"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// pageHTML is the page that follows a check's output: one file, its
// script and style inline, nothing fetched from anywhere else.
//
//go:embed page.html
var pageHTML []byte

// page is the page and the Content-Security-Policy that lets exactly its
// own inline script and style run.
type page struct {
	csp string
}

var (
	scriptRE = regexp.MustCompile(`(?s)<script>(.*?)</script>`)
	styleRE  = regexp.MustCompile(`(?s)<style>(.*?)</style>`)
)

func newPage() (*page, error) {
	script, style := scriptRE.FindSubmatch(pageHTML), styleRE.FindSubmatch(pageHTML)
	if script == nil || style == nil {
		return nil, errors.New("output page: no inline script or style")
	}
	hash := func(b []byte) string {
		sum := sha256.Sum256(b)
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	return &page{csp: fmt.Sprintf("default-src 'none'; script-src %s; style-src %s; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
		hash(script[1]), hash(style[1]))}, nil
}

// servePage serves the page for /runs/{did}/{key}; the page reads its
// check from its own path.
func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	if _, err := syntax.ParseDID(r.PathValue("did")); err != nil {
		http.NotFound(w, r)
		return
	}
	if _, err := syntax.ParseRecordKey(r.PathValue("key")); err != nil {
		http.NotFound(w, r)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Content-Security-Policy", h.page.csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-cache")
	_, _ = w.Write(pageHTML)
}
