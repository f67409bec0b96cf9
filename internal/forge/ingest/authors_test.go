package ingest

import (
	"fmt"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/work"
)

func strangerDID(i int) syntax.DID { return syntax.DID(fmt.Sprintf("did:plc:stranger%07d", i)) }

// A flood of records from 100,000 accounts, each new, leaves the
// Lister listing at most MaxAuthors of them at a reconcile; the
// authors of the pulls served stay, the newest strangers after them,
// and an account noted again is kept as the newest.
func TestAuthorsAreBounded(t *testing.T) {
	t.Parallel()
	const max = 100
	l := &Lister{MaxAuthors: max}
	author := syntax.DID("did:plc:author")
	l.Changed(Change{DID: author, Collection: forge.CollectionPull})
	l.Changed(Change{DID: "did:plc:other", Collection: forge.CollectionRefUpdate}) // not noted
	// A listing found an open pull of the author's for a repository
	// served.
	pull := syntax.ATURI("at://" + author.String() + "/" + forge.CollectionPull + "/3p1")
	l.confirmAuthors(&Snapshot{Events: []work.Event{{Kind: forge.KindPull, URI: pull}}})
	for i := range 100_000 {
		l.Changed(Change{DID: strangerDID(i), Collection: []string{forge.CollectionPull, forge.CollectionCancel, forge.CollectionRerun}[i%3]})
	}
	got := l.knownAuthors()
	if len(got) != max {
		t.Fatalf("%d authors known after the flood, want %d (MaxAuthors)", len(got), max)
	}
	if !got[author] {
		t.Error("the author of a pull served was pushed out by strangers")
	}
	if got["did:plc:other"] {
		t.Error("an account seen writing a push is listed for pulls")
	}
	for i := 100_000 - (max - 1); i < 100_000; i++ {
		if !got[strangerDID(i)] {
			t.Fatalf("stranger %d, among the newest, is not known", i)
		}
	}
	// Noted again: the newest, kept past max-2 more strangers.
	old := strangerDID(100_000 - (max - 1))
	l.Changed(Change{DID: old, Collection: forge.CollectionPull})
	for i := range max - 2 {
		l.Changed(Change{DID: strangerDID(200_000 + i), Collection: forge.CollectionPull})
	}
	if got := l.knownAuthors(); !got[old] || !got[author] || len(got) != max {
		t.Errorf("after a note again: %d known, the account noted again %v, the author %v", len(got), got[old], got[author])
	}
}

// Without MaxAuthors, DefaultMaxAuthors bounds them, confirmed or not.
func TestAuthorsDefaultBound(t *testing.T) {
	t.Parallel()
	l := &Lister{}
	var snap Snapshot
	for i := range 3 * DefaultMaxAuthors {
		l.Changed(Change{DID: strangerDID(i), Collection: forge.CollectionCancel})
		snap.Events = append(snap.Events, work.Event{Kind: forge.KindPull, URI: syntax.ATURI("at://" + strangerDID(i).String() + "/" + forge.CollectionPull + "/3p1")})
	}
	l.confirmAuthors(&snap)
	if n := len(l.knownAuthors()); n != DefaultMaxAuthors {
		t.Errorf("%d authors known, want %d", n, DefaultMaxAuthors)
	}
}
