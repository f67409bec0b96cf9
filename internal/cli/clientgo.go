package cli

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/klog/v2"
)

// routeClientGo sends client-go's logs where everything else goes, at
// their real level. klog's lines go to log, tagged component=client-go.
// So do the errors client-go cannot return (utilruntime.HandleError),
// through logUnhandled: by default they are all "Unhandled Error" at
// level error, and an operator reads an error line as a failure.
//
// serve calls it again with its journal logger, so that under systemd
// client-go's lines are journal entries with their fields and priority
// too, not text on stderr.
func routeClientGo(log *slog.Logger) {
	klog.SetSlogLogger(slog.New(closedAtDebug{log.Handler()}).With("component", "client-go"))
	// ErrorHandlers is client-go's own global: it is set once, to a
	// handler that logs through klog's logger of the moment.
	clientGoHandlers.Do(func() {
		utilruntime.ErrorHandlers = []utilruntime.ErrorHandler{logUnhandled}
	})
}

var clientGoHandlers sync.Once

// logUnhandled logs an error client-go could not return. Those of a
// closed exec stream are debug lines (level -4, logr's V(4)): a read on
// the closed connection is how a stream's reader ends once its command
// has ended and the stream is closed (three a step), or once a stopping
// daemon closed it to hand its run over; a write on a closed stream is
// the stdin copy finding it so. What such a close cost a run, the
// executor sees and reports itself. Others stay errors, as client-go
// ranks them.
func logUnhandled(ctx context.Context, err error, msg string, keysAndValues ...any) {
	log := klog.LoggerWithName(klog.FromContext(ctx), "UnhandledError")
	if closedStream(err) {
		log.V(4).Info(msg, append(keysAndValues, "err", err)...)
		return
	}
	log.Error(err, msg, keysAndValues...)
}

// closedAtDebug is client-go's log handler: an error line about a
// connection used after it closed is a debug line, for the reason
// logUnhandled gives. client-go logs some such errors itself
// (klog.Errorf: "Websocket Ping failed: use of closed network
// connection" when an exec stream's heartbeat fires as the stream
// closes, at a handover), without going through HandleError.
type closedAtDebug struct{ slog.Handler }

func (h closedAtDebug) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && closedText(r) {
		r.Level = slog.LevelDebug
		if !h.Handler.Enabled(ctx, r.Level) {
			return nil
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h closedAtDebug) WithAttrs(attrs []slog.Attr) slog.Handler {
	return closedAtDebug{h.Handler.WithAttrs(attrs)}
}

func (h closedAtDebug) WithGroup(name string) slog.Handler {
	return closedAtDebug{h.Handler.WithGroup(name)}
}

// closedText reports whether a record says, in its message or its
// error, that a connection or stream was used after it closed.
func closedText(r slog.Record) bool {
	closed := func(s string) bool {
		return strings.Contains(s, net.ErrClosed.Error()) || strings.Contains(s, "write on closed stream ")
	}
	found := closed(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" && closed(a.Value.String()) {
			found = true
		}
		return !found
	})
	return found
}

// closedStream reports whether err says an exec stream or its
// connection was used after it closed. client-go's WebSocket streams
// say the second in words only ("write on closed stream N").
func closedStream(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.HasPrefix(err.Error(), "write on closed stream ")
}
