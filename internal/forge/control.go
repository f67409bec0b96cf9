package forge

// The run-control collections: records the owner (or a pull's author)
// writes to act on runs.
const (
	CollectionCancel   = "dev.knotless.cancel"
	CollectionRerun    = "dev.knotless.rerun"
	CollectionDispatch = "dev.knotless.dispatch"
)

// Subject kinds of the work the owner starts without a push.
const (
	// KindDispatch is a dispatch record's run (trusted: the owner wrote
	// it); its event is the dispatch record.
	KindDispatch = "dispatch"
	// KindSchedule is a cron tick's run on the default branch (trusted);
	// its event is the repo record and its Tick the tick.
	KindSchedule = "schedule"
)

// Cancel is a dev.knotless.cancel record: stop the check whose key is
// Check, on Runner (or on every runner that has it).
type Cancel struct {
	Type      string `json:"$type"`
	Check     string `json:"check"`
	Runner    string `json:"runner,omitempty"`
	Repo      string `json:"repo,omitempty"`
	CreatedAt string `json:"createdAt"`
}

// Rerun is a dev.knotless.rerun record: run the workflows of the event
// of the check whose key is Check again, every one, only Workflow, or
// only the failed ones, with Env as run variables.
type Rerun struct {
	Type      string     `json:"$type"`
	Check     string     `json:"check"`
	Runner    string     `json:"runner,omitempty"`
	Repo      string     `json:"repo,omitempty"`
	Workflow  string     `json:"workflow,omitempty"`
	Failed    bool       `json:"failed,omitempty"`
	Env       []Variable `json:"env,omitempty"`
	CreatedAt string     `json:"createdAt"`
}

// Dispatch is a dev.knotless.dispatch record: run Workflow on the head
// of Ref with Inputs.
type Dispatch struct {
	Type      string     `json:"$type"`
	Repo      string     `json:"repo"`
	Ref       string     `json:"ref"`
	Workflow  string     `json:"workflow"`
	Runner    string     `json:"runner,omitempty"`
	Inputs    []Variable `json:"inputs,omitempty"`
	CreatedAt string     `json:"createdAt"`
}

// Variable is a name and its value: a re-run's env entry or a dispatch's
// input.
type Variable struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// CancelKey is the record key of the cancel of the check whose key is
// check on runner ("" for every runner): the first 16 bytes of
// sha256("cancel" "\n" runner "\n" check), unpadded lower-case base32,
// so cancelling the same check twice writes one record.
func CancelKey(runner, check string) string {
	return key("cancel\n" + runner + "\n" + check)
}

// SecretKey is the record key of the secret name of repo sealed to
// runner: sha256("secret" "\n" repo "\n" name "\n" runner), as CancelKey,
// so setting a secret again replaces its record.
func SecretKey(repo, name, runner string) string {
	return key("secret\n" + repo + "\n" + name + "\n" + runner)
}
