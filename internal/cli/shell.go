package cli

import (
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/executor/shell"
)

// ShellFlags configure the shell executor.
type ShellFlags struct {
	ShellRoot string `help:"Directory that holds the shell executor's run directories (default: the system temporary directory)." placeholder:"DIR"`
}

func (f *ShellFlags) executorDef() executorDef {
	return executorDef{
		Name: shell.Name,
		What: "processes of this host, for trusted code only",
		Dirs: executor.Dirs{Work: "<run dir>/work", Steps: "<run dir>/steps", Outputs: "<run dir>/outputs"},
		New: func(env *Env, o executorOptions) (executor.Executor, error) {
			return shell.New(shell.Config{Root: f.ShellRoot, Path: env.Getenv("PATH"), Runner: o.Runner, Limits: o.Limits, Logger: o.Logger}), nil
		},
	}
}
