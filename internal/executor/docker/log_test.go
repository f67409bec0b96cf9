package docker

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestLogKeysOnce: the executor's lines carry the caller's tags once.
// The command line tags it component=executor executor=docker; the
// executor used to add a second component (docker), so that every
// docker line said component twice.
func TestLogKeysOnce(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil)).With("component", "executor", "executor", Name)
	e, err := New(Config{Host: "unix:///nonexistent.sock", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.log.Info("swept run", "run", "r1")
	line := buf.String()
	if n := strings.Count(line, "component="); n != 1 {
		t.Errorf("a docker line has %d component keys, want 1: %s", n, line)
	}
	if !strings.Contains(line, "component=executor executor=docker") {
		t.Errorf("the line lost the caller's tags: %s", line)
	}
}
