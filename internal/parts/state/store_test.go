package state

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/forge"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// onDisk is state.json as the store wrote it.
func onDisk(t *testing.T, s *Store) *State {
	t.Helper()
	st, err := Load(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStoreMovesForward(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	s.st.Done = map[string]time.Time{"a": time.Unix(1, 0).UTC()}
	older := s.snapshotLocked()
	s.st.Done["b"] = time.Unix(2, 0).UTC()
	newer := s.snapshotLocked()
	if err := s.write(newer); err != nil {
		t.Fatal(err)
	}
	if err := s.write(older); err != nil {
		t.Fatal(err)
	}
	if got := onDisk(t, s); len(got.Done) != 2 {
		t.Errorf("state.json went back to an older snapshot: %v", got.Done)
	}
}

// TestStoreWritesOutsideTheLock: a state write in progress does not
// hold the state's lock (a slow disk must not stall the workers).
func TestStoreWritesOutsideTheLock(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	s.wmu.Lock() // a write that does not end
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.MarkDone("ev@c"); err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !s.Done("ev@c") { // reads take the lock: they must not wait for the write
		if time.Now().After(deadline) {
			t.Fatal("MarkDone never changed the state")
		}
		time.Sleep(time.Millisecond)
	}
	s.SetCursor("h", 1)
	s.wmu.Unlock()
	<-done
}

func TestStoreOpenRefusesACorruptFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, StateFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil {
		t.Fatal("a corrupt state.json opened")
	}
}

func TestStoreSession(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	if s.Session() != nil {
		t.Fatal("an empty state has a session")
	}
	if err := s.SetSession(forge.Session{AccountDID: "did:plc:runner", Host: "https://pds.test", AccessToken: "a", RefreshToken: "r"}); err != nil {
		t.Fatal(err)
	}
	got := s.Session()
	got.RefreshToken = "changed by the caller"
	if s.Session().RefreshToken != "r" || onDisk(t, s).Session.RefreshToken != "r" {
		t.Error("the session is not kept as set")
	}
}

func TestStoreNoteRepos(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	history := func(uri string) []string { return []string{uri + " old@c"} }
	noted, err := s.NoteRepos([]string{"r1", "r2"}, history)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{"r1": 1, "r2": 1}, noted); diff != "" {
		t.Errorf("noted (-want +got):\n%s", diff)
	}
	noted, err = s.NoteRepos([]string{"r1", "r3"}, func(string) []string { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{"r3": 0}, noted); diff != "" {
		t.Errorf("second look: noted (-want +got):\n%s", diff)
	}
	st := onDisk(t, s)
	if len(st.Repos) != 3 || !s.Done("r1 old@c") || len(st.Done) != 2 {
		t.Errorf("repos %v, done %v", st.Repos, st.Done)
	}
	if diff := cmp.Diff([]string{"r1 old@c", "r2 old@c"}, s.DoneKeys()); diff != "" {
		t.Errorf("done keys (-want +got):\n%s", diff)
	}
}

func TestStoreRuns(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	for _, k := range []string{"k1", "k2", "k3"} {
		if err := s.StartRun(k, Run{CheckKey: k, RunID: "r-" + k, Job: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DetachRun("k1", &run.Handover{Step: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.DetachRun("k2", &run.Handover{Step: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.DetachRun("gone", &run.Handover{}); err == nil {
		t.Error("a run not in the state was detached")
	}
	if r, ok := s.Run("k1"); !ok || r.Handover == nil || r.Handover.Step != 2 {
		t.Errorf("detached run %+v", r)
	}
	if err := s.ClaimHandovers([]string{"k1", "gone"}); err != nil {
		t.Fatal(err)
	}
	runs := s.Runs()
	if runs["k1"].Handover != nil || runs["k2"].Handover == nil {
		t.Errorf("after the claim: %+v", runs)
	}
	delete(runs, "k2") // a copy
	if _, ok := s.Run("k2"); !ok {
		t.Error("Runs is not a copy")
	}
	if diff := cmp.Diff([]string{"r-k1", "r-k2", "r-k3"}, s.RunIDs()); diff != "" {
		t.Errorf("run ids (-want +got):\n%s", diff)
	}
	dropped, err := s.KeepRuns([]string{"k1", "k2", "missing"})
	if err != nil || dropped != 1 {
		t.Errorf("KeepRuns dropped %d, %v; want 1", dropped, err)
	}
	if dropped, _ := s.KeepRuns([]string{"k1", "k2"}); dropped != 0 {
		t.Errorf("KeepRuns again dropped %d", dropped)
	}
	if err := s.EndRun("k1"); err != nil {
		t.Fatal(err)
	}
	st := onDisk(t, s)
	if _, ok := st.Runs["k2"]; len(st.Runs) != 1 || !ok {
		t.Errorf("runs on disk %v, want k2 alone", st.Runs)
	}
	if err := s.ClaimHandovers(nil); err != nil {
		t.Error(err)
	}
}

// TestStoreCursors: a cursor moves in memory; it is written when asked,
// once.
func TestStoreCursors(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	s.SetCursor("h", 42)
	if s.Cursor("h") != 42 || onDisk(t, s).Cursors["h"] != 0 {
		t.Fatal("SetCursor wrote, or did not move the cursor")
	}
	if err := s.SaveCursors(); err != nil {
		t.Fatal(err)
	}
	if onDisk(t, s).Cursors["h"] != 42 {
		t.Error("the cursor is not saved")
	}
	before := s.gen
	if err := s.SaveCursors(); err != nil {
		t.Fatal(err)
	}
	if s.gen != before {
		t.Error("cursors saved again though none moved")
	}
}

func TestStoreOwed(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	if err := s.Owe("k1", Owed{Check: json.RawMessage(`{}`), Event: "ev@c", Tries: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Owe("k2", Owed{Check: json.RawMessage(`{}`), Tries: 1}); err != nil {
		t.Fatal(err)
	}
	if !s.IsOwed("k1") || len(s.Owed()) != 2 {
		t.Fatalf("owed %v", s.Owed())
	}
	if err := s.Paid("k1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Forgive("k2"); err != nil {
		t.Fatal(err)
	}
	st := onDisk(t, s)
	if len(st.Owed) != 0 || !s.Done("ev@c") {
		t.Errorf("owed %v, done %v: want nothing owed and the paid check's event done", st.Owed, st.Done)
	}
	if len(st.Done) != 1 {
		t.Errorf("done %v: a forgiven check's event is not done", st.Done)
	}
}

func TestStorePrune(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	now := time.Now()
	for _, k := range []string{"old@c", "kept@c"} {
		if err := s.MarkDone(k); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.Prune(now.Add(time.Hour), func(k string) bool { return k == "kept@c" })
	if err != nil || n != 1 {
		t.Fatalf("pruned %d, %v; want 1", n, err)
	}
	if diff := cmp.Diff([]string{"kept@c"}, onDisk(t, s).doneKeys()); diff != "" {
		t.Errorf("done on disk (-want +got):\n%s", diff)
	}
	if n, _ := s.Prune(now.Add(-time.Hour), nil); n != 0 {
		t.Errorf("pruned %d recent events", n)
	}
}

func (st *State) doneKeys() []string {
	var out []string
	for k := range st.Done {
		out = append(out, k)
	}
	return out
}

func TestStoreLander(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	if s.Lander("r") != nil {
		t.Fatal("memory of a repository never seen")
	}
	if err := s.SetLander("r", json.RawMessage(`{"bisect":{}}`)); err != nil {
		t.Fatal(err)
	}
	if string(s.Lander("r")) != `{"bisect":{}}` || onDisk(t, s).Lander["r"] == nil {
		t.Errorf("lander memory %s", s.Lander("r"))
	}
	if err := s.Save(); err != nil {
		t.Fatal(err)
	}
	if snap := s.Snapshot(); snap.Lander["r"] == nil {
		t.Error("the snapshot has no lander memory")
	}
}
