// Package control holds the rules of run control: who may cancel,
// re-run or dispatch what (records the repository's owner, or a pull's
// author, writes in their own atproto repo), which workflows a re-run
// selects and at which attempt, what a dispatch runs with, and which
// tick of a schedule runs now. It is pure: the caller lists the records
// and the runner's checks, and acts on the decisions.
//
// The account that acts is always the one whose repository holds the
// record: the authority of the record's AT-URI, never a field of it.
package control

import (
	"fmt"
	"slices"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/rules/workflow"
)

// Action is what a record asks for.
type Action string

// The actions of run-control records.
const (
	Cancel   Action = "cancel"
	Rerun    Action = "rerun"
	Dispatch Action = "dispatch"
)

// Verdict is what becomes of a record.
type Verdict int

// The verdicts.
const (
	// NotMine: the record is for another runner, or names a check this
	// runner does not have. Nothing to do and nothing to say.
	NotMine Verdict = iota
	// Refuse: the record may not act (Err says why: a stranger's record,
	// or one that contradicts the check). Log it; write nothing.
	Refuse
	// Fail: the owner's record cannot run as written (Err says why: an
	// unknown workflow, a bad input). Write the check as error, with Err
	// as its text, so the owner sees it.
	Fail
	// Done: nothing (left) to do: the check is final already, or the
	// record has been served.
	Done
	// Wait: checks the record selects are still queued or running;
	// decide again once they have ended.
	Wait
	// Act: do what the record asks.
	Act
)

func (v Verdict) String() string {
	switch v {
	case NotMine:
		return "not mine"
	case Refuse:
		return "refuse"
	case Fail:
		return "fail"
	case Done:
		return "done"
	case Wait:
		return "wait"
	case Act:
		return "act"
	}
	return fmt.Sprintf("verdict %d", int(v))
}

// Refused is a record that may not act, and why.
type Refused struct {
	Action Action
	// Actor is the account whose repository holds the record.
	Actor string
	// Record is the record's AT-URI.
	Record string
	Reason string
}

func (e *Refused) Error() string {
	var b strings.Builder
	b.WriteString(string(e.Action))
	if e.Record != "" {
		b.WriteString(" " + e.Record)
	}
	if e.Actor != "" {
		b.WriteString(" by " + e.Actor)
	}
	b.WriteString(" refused: " + e.Reason)
	return b.String()
}

// record is a run-control record's URI, read: its actor (authority) and
// collection.
type record struct {
	action Action
	uri    string
	actor  string
}

func (r record) refuse(format string, args ...any) error {
	return &Refused{Action: r.action, Actor: r.actor, Record: r.uri, Reason: fmt.Sprintf(format, args...)}
}

var collectionOf = map[Action]string{
	Cancel:   forge.CollectionCancel,
	Rerun:    forge.CollectionRerun,
	Dispatch: forge.CollectionDispatch,
}

// readRecord takes the actor from the record's URI: the account whose
// repository holds it, which must be named by its DID.
func readRecord(a Action, uri string) (record, error) {
	r := record{action: a, uri: uri}
	u, err := syntax.ParseATURI(uri)
	if err != nil {
		return r, r.refuse("not an AT-URI: %v", err)
	}
	did, err := u.Authority().AsDID()
	if err != nil {
		return r, r.refuse("the record's account is not named by a DID")
	}
	r.actor = did.String()
	if got := u.Collection().String(); got != collectionOf[a] {
		return r, r.refuse("a %s record, not %s", got, collectionOf[a])
	}
	return r, nil
}

// May decides whether actor (a DID) may take action a on work about
// subject s: the repository's owner may do everything in the repository
// (s.Repo); a pull's author may cancel and re-run that pull's checks
// (kind pull, s.Event the author's own pull record); anyone else is
// refused. A dispatch passes a subject with only Repo. The error is a
// *Refused naming the rule.
func May(actor string, a Action, s forge.Subject) error {
	return record{action: a, actor: actor}.may(s)
}

func (r record) may(s forge.Subject) error {
	owner, err := ownerOf(s.Repo)
	if err != nil {
		return r.refuse("%v", err)
	}
	if r.actor == owner {
		return nil
	}
	if r.action == Dispatch {
		return r.refuse("only the repository's owner (%s) dispatches its workflows", owner)
	}
	if s.Kind != forge.KindPull {
		return r.refuse("not the repository's owner (%s): a %s check is the owner's to %s", owner, s.Kind, r.action)
	}
	author, err := authorOf(s.Event)
	if err != nil {
		return r.refuse("%v", err)
	}
	if r.actor != author {
		return r.refuse("neither the repository's owner (%s) nor the pull's author (%s)", owner, author)
	}
	return nil
}

// ownerOf is the DID of the repository repo (an AT-URI of a repo
// record).
func ownerOf(repo string) (string, error) {
	u, err := syntax.ParseATURI(repo)
	if err != nil || u.Collection().String() != forge.CollectionRepo || u.RecordKey() == "" {
		return "", fmt.Errorf("repository %q is not the AT-URI of a %s record", repo, forge.CollectionRepo)
	}
	did, err := u.Authority().AsDID()
	if err != nil {
		return "", fmt.Errorf("repository %q is not named by its owner's DID", repo)
	}
	return did.String(), nil
}

// authorOf is the DID of the account that wrote the pull record pull.
func authorOf(pull string) (string, error) {
	u, err := syntax.ParseATURI(pull)
	if err != nil || u.Collection().String() != forge.CollectionPull {
		return "", fmt.Errorf("the check's event %q is not a %s record", pull, forge.CollectionPull)
	}
	did, err := u.Authority().AsDID()
	if err != nil {
		return "", fmt.Errorf("the check's pull %q is not named by its author's DID", pull)
	}
	return did.String(), nil
}

// Trusted reports whether work of the subject kind runs trusted (with
// secrets and the trusted cache): a push (the owner's or the lander's),
// a dispatch (the owner's record) and a schedule (the default branch).
// Pulls and batches are untrusted, and so is any kind not known. A
// re-run is of the same kind as its original, so it keeps its trust.
func Trusted(kind string) bool {
	return slices.Contains([]string{forge.KindPush, forge.KindDispatch, forge.KindSchedule}, kind)
}

// forThisRunner is the common start of a cancel or re-run: the record
// names this runner or none, this runner has the check it names, and the
// record's repository, when it names one, is the check's.
func forThisRunner(r record, runner, recRunner, recRepo string, check *forge.Check) (Verdict, error) {
	if recRunner != "" && recRunner != runner {
		return NotMine, nil
	}
	if check == nil {
		return NotMine, nil
	}
	if recRepo != "" && recRepo != check.Subject.Repo {
		return Refuse, r.refuse("it names the repository %s, and the check is of %s", recRepo, check.Subject.Repo)
	}
	if err := r.may(check.Subject); err != nil {
		return Refuse, err
	}
	return Act, nil
}

// DecideCancel decides the cancel record uri on this runner (its DID):
// check is the runner's check whose key the record names (nil when it
// has none). Act means: drop the check if it is queued, stop its run if
// it is running; either way it ends cancelled, naming uri (CancelledBy).
// A final check is Done: a cancel never changes a result.
func DecideCancel(runner, uri string, rec forge.Cancel, check *forge.Check) (Verdict, error) {
	r, err := readRecord(Cancel, uri)
	if err != nil {
		return Refuse, err
	}
	v, err := forThisRunner(r, runner, rec.Runner, rec.Repo, check)
	if v != Act {
		return v, err
	}
	if check.Final() {
		return Done, nil
	}
	return Act, nil
}

// CancelledText is the error text of a check a cancel record stopped.
func CancelledText(uri string) string { return "cancelled by " + uri }

// Vars turns a record's name/value pairs into run variables, in order.
// They are checked where the run starts (workflow.CheckRunVars, with the
// secrets the workflow grants), so a bad one ends the run as an error
// check naming it.
func Vars(vs []forge.Variable) []workflow.EnvVar {
	if len(vs) == 0 {
		return nil
	}
	out := make([]workflow.EnvVar, len(vs))
	for i, v := range vs {
		out[i] = workflow.EnvVar{Name: v.Name, Value: v.Value}
	}
	return out
}
