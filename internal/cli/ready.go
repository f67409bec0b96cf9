package cli

import (
	"errors"
	"fmt"
	"log/slog"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"

	"knotless.dev/run/internal/observe/readiness"
)

// ReadyCmd is a readiness probe: it reads the file `serve --ready-file`
// keeps.
type ReadyCmd struct {
	ReadyFile string `help:"The file serve --ready-file keeps." required:"" placeholder:"FILE"`
}

// Run exits 0 when the daemon is ready, else prints why and exits 1.
func (c *ReadyCmd) Run(env *Env) error {
	if err := readiness.Check(c.ReadyFile); err != nil {
		if errors.Is(err, readiness.ErrNotReady) {
			fmt.Fprintf(env.Stdout, "%v\n", err)
			return exitError{code: ExitFailure}
		}
		return err
	}
	fmt.Fprintln(env.Stdout, "ready")
	return nil
}

// notifier sends the daemon's notify messages to systemd (when under
// it) and to the --ready-file.
func (c *ServeCmd) notifier(log *slog.Logger) (func(string), error) {
	sd := func(s string) { _, _ = sddaemon.SdNotify(false, s) }
	if c.ReadyFile == "" {
		return sd, nil
	}
	f, err := readiness.New(c.ReadyFile)
	if err != nil {
		return nil, err
	}
	return func(s string) {
		sd(s)
		if err := f.Notify(s); err != nil {
			log.Error("ready file", "err", err)
		}
	}, nil
}
