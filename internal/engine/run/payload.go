package run

import (
	"fmt"
	"path"
	"slices"
	"strconv"

	"knotless.dev/run/internal/engine/payload"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/lib/mask"
	"knotless.dev/run/internal/rules/workflow"
)

// grantSecrets decides which secret values the run gets: none for an
// untrusted run, else each name the workflow grants, which must have a
// value. It first checks the run variables, which stand beside them in
// every payload.
func (r *runState) grantSecrets() error {
	r.granted = map[string]string{}
	if err := workflow.CheckRunVars(r.req.Vars, r.req.Workflow.Secrets); err != nil {
		return err
	}
	if !r.req.Trusted {
		return nil
	}
	for _, name := range r.req.Workflow.Secrets {
		v, ok := r.req.Secrets[name]
		if !ok {
			return fmt.Errorf("secret %s is granted by workflow %s but this runner has no value for it", name, r.req.Workflow.Name)
		}
		r.granted[name] = v
	}
	return nil
}

// grantedValues are the values of the granted secrets: what the log, a
// dry run's payloads and the run's error are masked with.
func (r *runState) grantedValues() []string {
	values := make([]string, 0, len(r.granted))
	for _, v := range r.granted {
		values = append(values, v)
	}
	return values
}

// payload builds the text that starts step i: the runner's variables,
// the workflow's env and the run's variables, the step's granted
// secrets, and its script, started in the work directory or the step's
// working-directory in it.
func (r *runState) payload(dirs executor.Dirs, i int) (string, error) {
	s := r.req.Workflow.Steps[i]
	env := []payload.Var{
		{Name: executor.EnvWork, Value: dirs.Work},
		{Name: executor.EnvSteps, Value: dirs.Steps},
		{Name: executor.EnvOutputs, Value: dirs.Outputs},
		{Name: executor.EnvRunID, Value: r.req.RunID},
		{Name: executor.EnvWorkflow, Value: r.req.Workflow.Name},
		{Name: executor.EnvStep, Value: s.Name},
		{Name: executor.EnvStepOutput, Value: path.Join(dirs.Steps, executor.StepOutputsDir, strconv.Itoa(i+1))},
		{Name: "CI", Value: "true"},
	}
	// The workflow's env, then the run's variables, then the step's own
	// (with the earlier steps' outputs it names): a later one of the
	// same name takes the place of the earlier.
	for _, vars := range [][]workflow.EnvVar{r.req.Workflow.Env, r.req.Vars, r.req.Workflow.StepEnv(i, r.outputs)} {
		for _, v := range vars {
			env = slices.DeleteFunc(env, func(e payload.Var) bool { return e.Name == v.Name })
			env = append(env, payload.Var{Name: v.Name, Value: v.Value})
		}
	}
	var secrets []payload.Var
	for _, name := range s.Secrets {
		if v, ok := r.granted[name]; ok {
			secrets = append(secrets, payload.Var{Name: name, Value: v})
		}
	}
	return payload.Build(payload.Step{
		Env:     env,
		Secrets: secrets,
		Dir:     path.Join(dirs.Work, s.WorkingDirectory),
		Script:  path.Join(dirs.Steps, strconv.Itoa(i+1)),
	})
}

// DryRun returns each step's payload with secret values masked, as the
// executor would receive it.
func (e *Engine) DryRun(req Request, dirs executor.Dirs) ([]string, error) {
	r := &runState{eng: e, req: req}
	if err := r.grantSecrets(); err != nil {
		return nil, err
	}
	// The session it shows (SessionSpec) is of the run's class.
	if err := e.classErr(req); err != nil {
		return nil, err
	}
	var out []string
	for i := range req.Workflow.Steps {
		text, err := r.payload(dirs, i)
		if err != nil {
			return nil, err
		}
		out = append(out, mask.String(text, r.grantedValues()))
	}
	return out, nil
}
