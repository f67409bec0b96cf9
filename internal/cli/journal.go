package cli

import (
	"context"
	"log/slog"
	"strings"

	"github.com/coreos/go-systemd/v22/journal"
)

// journalHandler is an slog.Handler writing structured entries to the
// journal, used when stderr is the journal's stream.
type journalHandler struct {
	level  slog.Level
	attrs  []slog.Attr
	prefix string
}

func newJournalHandler(level slog.Level) *journalHandler { return &journalHandler{level: level} }

func (h *journalHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *journalHandler) Handle(_ context.Context, r slog.Record) error {
	vars := map[string]string{"SYSLOG_IDENTIFIER": "knotless-run"}
	var add func(prefix string, a slog.Attr)
	add = func(prefix string, a slog.Attr) {
		if a.Value.Kind() == slog.KindGroup {
			for _, g := range a.Value.Group() {
				add(prefix+a.Key+"_", g)
			}
			return
		}
		vars[journalField(prefix+a.Key)] = a.Value.String()
	}
	for _, a := range h.attrs {
		add("", a)
	}
	r.Attrs(func(a slog.Attr) bool { add(h.prefix, a); return true })
	return journal.Send(r.Message, journalPriority(r.Level), vars)
}

func (h *journalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	for _, a := range attrs {
		a.Key = h.prefix + a.Key
		c.attrs = append(append([]slog.Attr(nil), c.attrs...), a)
	}
	return &c
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.prefix = h.prefix + name + "_"
	return &c
}

func journalPriority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	default:
		return journal.PriDebug
	}
}

// journalField makes a journal field name: upper case letters, digits
// and underscores, not starting with an underscore.
func journalField(k string) string {
	var b strings.Builder
	for _, r := range strings.ToUpper(k) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := strings.TrimLeft(b.String(), "_")
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		s = "F_" + s
	}
	return s
}

// minLevel finds the lowest level the logger writes.
func minLevel(l *slog.Logger) slog.Level {
	for _, lvl := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if l.Enabled(context.Background(), lvl) {
			return lvl
		}
	}
	return slog.LevelError
}
