package control

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/forge"
)

const (
	owner    = "did:plc:owner0000000000000000000"
	author   = "did:plc:author000000000000000000"
	stranger = "did:plc:stranger0000000000000000"
	runner   = "did:plc:runner0000000000000000000"
	other    = "did:plc:otherrunner00000000000000"
	repo     = "at://" + owner + "/dev.knotless.repo/hello"
	pullURI  = "at://" + author + "/dev.knotless.pull/3n3pa7x34wk22"
	pushURI  = "at://" + owner + "/dev.knotless.refUpdate/3n3pa7x34wk22"
)

var (
	commit      = strings.Repeat("a", 40)
	pushSubject = forge.Subject{Repo: repo, Commit: commit, Ref: "refs/heads/main", Event: pushURI, Kind: forge.KindPush}
	pullSubject = forge.Subject{Repo: repo, Commit: commit, Ref: "refs/heads/main", Event: pullURI, Kind: forge.KindPull}
)

func cancelURI(actor string) string { return "at://" + actor + "/dev.knotless.cancel/k" }
func rerunURI(actor string) string  { return "at://" + actor + "/dev.knotless.rerun/3n3pa7x34wk22" }

func TestMay(t *testing.T) {
	t.Parallel()
	batch := forge.Subject{Repo: repo, Commit: commit, Event: "at://" + runner + "/dev.knotless.batch/b", Kind: forge.KindBatch}
	tests := []struct {
		name   string
		actor  string
		action Action
		s      forge.Subject
		want   string // "" allowed, else the refusal's reason
	}{
		{"owner cancels a push", owner, Cancel, pushSubject, ""},
		{"owner re-runs a pull", owner, Rerun, pullSubject, ""},
		{"owner cancels a batch", owner, Cancel, batch, ""},
		{"owner dispatches", owner, Dispatch, forge.Subject{Repo: repo}, ""},
		{"author cancels their pull", author, Cancel, pullSubject, ""},
		{"author re-runs their pull", author, Rerun, pullSubject, ""},
		{"author may not cancel a push", author, Cancel, pushSubject,
			"not the repository's owner (" + owner + "): a push check is the owner's to cancel"},
		{"author may not re-run a batch", author, Rerun, batch,
			"not the repository's owner (" + owner + "): a batch check is the owner's to rerun"},
		{"author may not dispatch", author, Dispatch, forge.Subject{Repo: repo},
			"only the repository's owner (" + owner + ") dispatches its workflows"},
		{"stranger may not cancel a pull", stranger, Cancel, pullSubject,
			"neither the repository's owner (" + owner + ") nor the pull's author (" + author + ")"},
		{"stranger may not re-run a push", stranger, Rerun, pushSubject,
			"not the repository's owner (" + owner + "): a push check is the owner's to rerun"},
		{"stranger may not dispatch", stranger, Dispatch, forge.Subject{Repo: repo},
			"only the repository's owner (" + owner + ") dispatches its workflows"},
		{"repository by handle", owner, Cancel, forge.Subject{Repo: "at://alice.test/dev.knotless.repo/hello", Kind: forge.KindPush},
			`repository "at://alice.test/dev.knotless.repo/hello" is not named by its owner's DID`},
		{"repository of another collection", owner, Dispatch, forge.Subject{Repo: "at://" + owner + "/dev.knotless.pull/x"},
			`repository "at://` + owner + `/dev.knotless.pull/x" is not the AT-URI of a dev.knotless.repo record`},
		{"pull check whose event is no pull", author, Cancel, forge.Subject{Repo: repo, Event: pushURI, Kind: forge.KindPull},
			`the check's event "` + pushURI + `" is not a dev.knotless.pull record`},
		{"pull by handle", author, Cancel, forge.Subject{Repo: repo, Event: "at://bob.test/dev.knotless.pull/x", Kind: forge.KindPull},
			`the check's pull "at://bob.test/dev.knotless.pull/x" is not named by its author's DID`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := May(tt.actor, tt.action, tt.s)
			got := ""
			if err != nil {
				var r *Refused
				if !errors.As(err, &r) {
					t.Fatalf("error %T is not a *Refused: %v", err, err)
				}
				if r.Actor != tt.actor || r.Action != tt.action {
					t.Errorf("refused %s by %s, want %s by %s", r.Action, r.Actor, tt.action, tt.actor)
				}
				got = r.Reason
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("May (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTrusted(t *testing.T) {
	t.Parallel()
	for kind, want := range map[string]bool{
		forge.KindPush: true, forge.KindDispatch: true, forge.KindSchedule: true,
		forge.KindPull: false, forge.KindBatch: false, "": false, "other": false,
	} {
		if got := Trusted(kind); got != want {
			t.Errorf("Trusted(%q) = %v, want %v", kind, got, want)
		}
	}
}

func TestDecideCancel(t *testing.T) {
	t.Parallel()
	running := &forge.Check{Workflow: "build", Status: forge.StatusRunning, Subject: pushSubject}
	queuedPull := &forge.Check{Workflow: "build", Status: forge.StatusQueued, Subject: pullSubject}
	final := &forge.Check{Workflow: "build", Status: "success", Subject: pushSubject}
	rec := forge.Cancel{Check: "k"}
	tests := []struct {
		name  string
		uri   string
		rec   forge.Cancel
		check *forge.Check
		want  Verdict
		err   string
	}{
		{"owner stops a running check", cancelURI(owner), rec, running, Act, ""},
		{"author drops their queued pull check", cancelURI(author), rec, queuedPull, Act, ""},
		{"a final check stays as it is", cancelURI(owner), rec, final, Done, ""},
		{"a check this runner does not have", cancelURI(owner), rec, nil, NotMine, ""},
		{"another runner's", cancelURI(owner), forge.Cancel{Check: "k", Runner: other}, running, NotMine, ""},
		{"this runner named", cancelURI(owner), forge.Cancel{Check: "k", Runner: runner, Repo: repo}, running, Act, ""},
		{"a stranger", cancelURI(stranger), rec, queuedPull, Refuse,
			"cancel " + cancelURI(stranger) + " by " + stranger + " refused: neither the repository's owner (" + owner + ") nor the pull's author (" + author + ")"},
		{"the author on a push", cancelURI(author), rec, running, Refuse,
			"cancel " + cancelURI(author) + " by " + author + " refused: not the repository's owner (" + owner + "): a push check is the owner's to cancel"},
		{"another repository named", cancelURI(owner), forge.Cancel{Check: "k", Repo: "at://" + owner + "/dev.knotless.repo/other"}, running, Refuse,
			"cancel " + cancelURI(owner) + " by " + owner + " refused: it names the repository at://" + owner + "/dev.knotless.repo/other, and the check is of " + repo},
		{"not a cancel record", rerunURI(owner), rec, running, Refuse,
			"cancel " + rerunURI(owner) + " by " + owner + " refused: a dev.knotless.rerun record, not dev.knotless.cancel"},
		{"not an AT-URI", "cancel", rec, running, Refuse,
			"cancel cancel refused: not an AT-URI: AT-URI syntax didn't validate via regex"},
		{"a record by handle", "at://bob.test/dev.knotless.cancel/k", rec, running, Refuse,
			"cancel at://bob.test/dev.knotless.cancel/k refused: the record's account is not named by a DID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := DecideCancel(runner, tt.uri, tt.rec, tt.check)
			if got != tt.want {
				t.Errorf("verdict %s, want %s (err %v)", got, tt.want, err)
			}
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if diff := cmp.Diff(tt.err, gotErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
	if got := CancelledText(cancelURI(owner)); got != "cancelled by "+cancelURI(owner) {
		t.Errorf("CancelledText = %q", got)
	}
}

func TestVerdictString(t *testing.T) {
	t.Parallel()
	var got []string
	for v := NotMine; v <= Act+1; v++ {
		got = append(got, v.String())
	}
	if diff := cmp.Diff([]string{"not mine", "refuse", "fail", "done", "wait", "act", "verdict 6"}, got); diff != "" {
		t.Error(diff)
	}
}

func TestRefusedError(t *testing.T) {
	t.Parallel()
	err := May(stranger, Dispatch, forge.Subject{Repo: repo})
	want := "dispatch by " + stranger + " refused: only the repository's owner (" + owner + ") dispatches its workflows"
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}
