package state

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
)

func TestSaveLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := New()
	s.Cursors = map[string]int64{"http://localhost:1": 42}
	s.Runs = map[string]Run{"k": {CheckKey: "k", RunID: "r1", Workflow: "build",
		Job: []byte(`{"tree":"abc"}`),
		Handover: &run.Handover{Session: executor.Ref{Executor: "kubernetes", RunID: "r1", Namespace: "ns", Name: "job"}, Step: 2, Started: true, Offset: 99,
			StartedAt: time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC), Steps: []run.StepResult{{Name: "a", Status: run.Success}}}}}
	if err := s.Save(dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Saving indents the opaque job; what it says must not change.
	compact := cmp.Transformer("compact", func(m json.RawMessage) string {
		var b bytes.Buffer
		if err := json.Compact(&b, m); err != nil {
			return "invalid: " + err.Error()
		}
		return b.String()
	})
	if diff := cmp.Diff(s, got, compact); diff != "" {
		t.Errorf("(-saved +loaded):\n%s", diff)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left temporary files: %v", entries)
	}
}

func TestLoadRefuses(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"corrupt":         `{"version": 1, "runs": {`,
		"unknown version": `{"version": 7}`,
		"no version":      `{}`,
		"unknown field":   `{"version": 1, "surprise": true}`,
	} {
		dir := t.TempDir()
		file := filepath.Join(dir, StateFile)
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: got %v, want an error naming %s", name, err, file)
		}
		if b, _ := os.ReadFile(file); string(b) != body {
			t.Errorf("%s: file changed", name)
		}
	}
	if s, err := Load(t.TempDir()); err != nil || s.Version != Version {
		t.Errorf("missing file: %v %+v", err, s)
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k1, created, err := LoadKey(dir)
	if err != nil || !created {
		t.Fatalf("first load: created=%v %v", created, err)
	}
	k2, created, err := LoadKey(dir)
	if err != nil || created || k1.Public != k2.Public || k1.Private != k2.Private {
		t.Fatalf("second load: created=%v %v", created, err)
	}
	fi, _ := os.Stat(filepath.Join(dir, KeyFile))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode().Perm())
	}
}
