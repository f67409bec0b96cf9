package docker

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/internal/rules/class"
)

// TestDiskUnboundedWarning starts runs on the test daemon (Debian's
// Docker 20.10, overlay2 over ext4, where --storage-opt size is
// refused): the first run whose class bounds the disk (the default
// class does, at 10Gi) has the executor say once that the bound is not
// applied, naming the class and its bound; a class without a disk
// bound says nothing.
func TestDiskUnboundedWarning(t *testing.T) {
	t.Parallel()
	d := daemon.Get(t)
	set, err := class.ParseSet()
	if err != nil {
		t.Fatal(err)
	}
	def, err := set.Pick(class.Default, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cls  class.Class
		want int
	}{
		{"default class", def, 1},
		{"no disk bound", class.Class{Name: "bare"}, 0},
	} {
		var logs syncbuf.Buffer
		ex := newExecutor(t, d, runner(t), Config{Network: NetworkNone, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		for _, id := range []string{"disk1", "disk2"} {
			s, err := ex.Start(context.Background(), executor.Spec{RunID: id + strings.ReplaceAll(c.name, " ", ""), Runner: ex.cfg.Runner, Image: d.Image(), Class: c.cls})
			if err != nil {
				t.Fatalf("%s: start: %v", c.name, err)
			}
			if err := s.Stop(context.Background()); err != nil {
				t.Errorf("%s: stop: %v", c.name, err)
			}
		}
		text := logs.String()
		if n := strings.Count(text, "disk is not bounded"); n != c.want {
			t.Errorf("%s: %d warnings, want %d:\n%s", c.name, n, c.want, text)
		}
		if c.want > 0 && !strings.Contains(text, "ephemeral_storage="+class.DefaultEphemeralStorage) {
			t.Errorf("%s: the warning does not name the class's bound %s:\n%s", c.name, class.DefaultEphemeralStorage, text)
		}
	}
}
