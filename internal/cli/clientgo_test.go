package cli

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/klog/v2"
)

// TestClientGoErrorsAtTheirLevel: an error client-go cannot return goes
// to the command's log, tagged component=client-go. A read on a closed
// connection, as each exec stream's reader ends after its step, is a
// debug line, not the error line it was, and so is a write on a closed
// stream (the stdin copy of an exec that ended); another error stays an
// error. So is an error line client-go logs itself about a closed
// connection (issue 35: "Websocket Ping failed" at a handover).
//
// Not parallel: client-go's logger is the process's, and Main sets it.
func TestClientGoErrorsAtTheirLevel(t *testing.T) {
	closed := fmt.Errorf("next reader: %w", &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed})
	closedWrite := errors.New("write on closed stream 0")
	other := errors.New("error reading from error stream: stream reset")
	const prefix = `msg="Unhandled Error" component=client-go logger=UnhandledError err=`
	debug := []string{
		`level=debug ` + prefix + `"next reader: read tcp: use of closed network connection"`,
		`level=debug ` + prefix + `"write on closed stream 0"`,
		`level=debug msg="Websocket Ping failed: write tcp: use of closed network connection" component=client-go`,
	}
	stays := `level=error ` + prefix + `"error reading from error stream: stream reset"`
	for _, tt := range []struct {
		level string
		want  []string // lines the log has
	}{
		{"debug", append(debug, stays)},
		{"info", []string{stays}},
	} {
		t.Run(tt.level, func(t *testing.T) {
			var stdout, stderr strings.Builder
			if code := Main(t.Context(), []string{"--log-format", "logfmt", "--log-level", tt.level, "version"},
				Env{Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr, Getenv: os.Getenv}); code != 0 {
				t.Fatalf("version: exit %d: %s", code, stderr.String())
			}
			utilruntime.HandleError(closed)
			utilruntime.HandleError(closedWrite)
			utilruntime.HandleError(other)
			// client-go's own error line, as a heartbeat that fires while
			// an exec stream closes writes it.
			klog.Errorf("Websocket Ping failed: %v", &net.OpError{Op: "write", Net: "tcp", Err: net.ErrClosed})
			klog.Flush()
			got := stderr.String()
			for _, want := range tt.want {
				if !strings.Contains(got, want) {
					t.Errorf("the log lacks %s:\n%s", want, got)
				}
			}
			if n := strings.Count(got, "\n"); n != len(tt.want) {
				t.Errorf("the log has %d lines, want %d:\n%s", n, len(tt.want), got)
			}
		})
	}
}
