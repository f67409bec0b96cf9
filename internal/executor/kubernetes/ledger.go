package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/kube/kubeexec"
)

// maxLedger bounds what is read of a pod's ledger: two short lines a
// step, far more steps than a workflow may have. The pod is the run's:
// whatever its steps wrote there is read as a stranger's.
const maxLedger = 256 << 10

// Ledger implements executor.StepLedger: the step tool's ledger in the
// pod (scripts/step.sh). A step runs in the same pod and could write
// there too; what it could gain is its own run's steps skipped or
// failed, which its workflow can do anyway.
func (s *Session) Ledger(ctx context.Context) (map[string]executor.StepRecord, error) {
	var stdout, stderr bytes.Buffer
	out := &limitedBuffer{b: &stdout, max: maxLedger}
	code, err := s.exec(ctx, []string{"sh", "-c", stepScript, "knotless-step", "ledger", stepStateDir, "-"}, kubeexec.Streams{Stdout: out, Stderr: &stderr})
	if err != nil {
		return nil, fmt.Errorf("read the step ledger of %s: %w", s.ref, err)
	}
	if code != 0 {
		return nil, fmt.Errorf("read the step ledger of %s: exit %d: %s", s.ref, code, strings.TrimSpace(stderr.String()))
	}
	if out.over {
		return nil, fmt.Errorf("read the step ledger of %s: longer than %d bytes", s.ref, maxLedger)
	}
	return parseLedger(stdout.String())
}

// parseLedger reads the ledger's lines: "start ID" and "exit ID CODE".
func parseLedger(text string) (map[string]executor.StepRecord, error) {
	steps := map[string]executor.StepRecord{}
	for n, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" && n == 0 {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "start":
			if _, ok := steps[f[1]]; !ok {
				steps[f[1]] = executor.StepRecord{}
			}
		case len(f) == 3 && f[0] == "exit":
			code, err := strconv.Atoi(f[2])
			if err != nil || code < 0 || code > 255 {
				return nil, fmt.Errorf("step ledger line %d: bad exit code %q", n+1, f[2])
			}
			steps[f[1]] = executor.StepRecord{Exit: &code}
		default:
			return nil, fmt.Errorf("step ledger line %d: %q is neither \"start ID\" nor \"exit ID CODE\"", n+1, line)
		}
	}
	return steps, nil
}

// limitedBuffer keeps at most max bytes and notes whether more came.
type limitedBuffer struct {
	b    *bytes.Buffer
	max  int
	over bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := l.max - l.b.Len(); n > room {
		l.over = true
		p = p[:max(room, 0)]
	}
	l.b.Write(p)
	return n, nil
}
