package docker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor"
	"knotless.dev/run/internal/rules/workflow"
)

// BenchmarkStep measures one trivial step through the executor
// (StartStep and FollowStep: the launcher's exec with the payload on
// stdin, its output, its exit status, the clean-up of what it left)
// against the bare round trip of an exec of `true` with the Engine API
// (create, attach, read to the end, inspect), in the same container.
func BenchmarkStep(b *testing.B) {
	d := daemon.Get(b)
	ex := newExecutor(b, d, runner(b), Config{})
	s := startSession(b, ex, d.Image(), "benchstep", executor.Resources{})
	ctx := context.Background()
	payload := []byte("set -e\ncd /work\nexec sh -e -c true\n")
	var bare, step time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := bareExec(ctx, ex, s.id, "true"); err != nil {
			b.Fatal(err)
		}
		bare += time.Since(start)

		start = time.Now()
		id := strconv.Itoa(i)
		if err := s.StartStep(ctx, id, payload); err != nil {
			b.Fatal(err)
		}
		exit, err := s.FollowStep(ctx, id, 0, io.Discard)
		if err != nil || exit.Code != 0 {
			b.Fatalf("step: %v, exit %d", err, exit.Code)
		}
		step += time.Since(start)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(bare.Seconds()*1000/n, "bare-exec-ms")
	b.ReportMetric(step.Seconds()*1000/n, "step-ms")
	b.ReportMetric(step.Seconds()/bare.Seconds(), "step/bare")
}

// bareExec is the smallest exec round trip that learns an exit code.
func bareExec(ctx context.Context, e *Executor, id string, cmd ...string) error {
	ex, err := e.cli.ExecCreate(ctx, id, client.ExecCreateOptions{AttachStdout: true, AttachStderr: true, Cmd: cmd})
	if err != nil {
		return err
	}
	att, err := e.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return err
	}
	defer att.Close()
	if _, err := stdcopy.StdCopy(io.Discard, io.Discard, att.Reader); err != nil {
		return err
	}
	st, err := e.inspectExec(ctx, ex.ID)
	if err != nil {
		return err
	}
	if st.Running || st.ExitCode == nil || *st.ExitCode != 0 {
		return fmt.Errorf("bare exec: %+v", st)
	}
	return nil
}

// BenchmarkWorkflow runs the example workflow (examples/hello) through
// the engine on this executor, and the same workflow driven by `docker`
// CLI subprocesses against the same daemon: the same network, volumes,
// hardened container, copies in, one `docker exec -i` per step with the
// same payload and launcher, copy out and removal. The CLI is Debian's
// docker.io client; this is the only place the executor's tests run it.
func BenchmarkWorkflow(b *testing.B) {
	d := daemon.Get(b)
	docker := "/usr/bin/docker"
	if _, err := os.Stat(docker); err != nil {
		b.Fatalf("the baseline needs Debian's docker.io client at %s: %v", docker, err)
	}
	wf, checkout := loadExample(b)
	did := runner(b)
	eng := run.New(run.Config{Executor: newExecutor(b, d, did, Config{}), DefaultImage: d.Image(), Runner: did, CleanupTimeout: time.Minute})
	payloads, err := eng.DryRun(run.Request{RunID: "cli", Workflow: wf, Checkout: checkout, Trusted: true}, executor.PodDirs())
	if err != nil {
		b.Fatal(err)
	}
	scripts := b.TempDir()
	for i, s := range wf.Steps {
		body := []byte(s.Run)
		if s.Uses != "" {
			if body, err = os.ReadFile(filepath.Join(checkout, workflow.StepsDir, s.Uses)); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(scripts, strconv.Itoa(i+1)), body, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	cli := &dockerCLI{bin: docker, env: []string{"DOCKER_HOST=" + d.Host(), "DOCKER_CONFIG=" + b.TempDir(), "PATH=" + os.Getenv("PATH")}}
	var viaEngine, viaCLI time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		res := eng.Run(context.Background(), run.Request{RunID: fmt.Sprintf("bench%d", i), Workflow: wf, Checkout: checkout, Outputs: b.TempDir(), Trusted: true})
		if res.Status != run.Success || len(res.Outputs) != 2 {
			b.Fatalf("engine run: %s (%s) outputs %v\n%s", res.Status, res.Error, res.Outputs, res.Log)
		}
		viaEngine += time.Since(start)

		start = time.Now()
		out := b.TempDir()
		if err := cli.workflow(fmt.Sprintf("knotless-cli-%s-%d", executor.RunnerLabel(did), i), d.Image(), checkout, scripts, payloads, out); err != nil {
			b.Fatal(err)
		}
		viaCLI += time.Since(start)
		if entries, _ := os.ReadDir(out); len(entries) != 2 {
			b.Fatalf("cli run brought back %d outputs", len(entries))
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(viaEngine.Seconds()*1000/n, "engine-ms")
	b.ReportMetric(viaCLI.Seconds()*1000/n, "cli-ms")
	b.ReportMetric(viaCLI.Seconds()/viaEngine.Seconds(), "cli/engine")
}

type dockerCLI struct {
	bin string
	env []string
}

func (c *dockerCLI) run(stdin io.Reader, args ...string) (string, error) {
	cmd := exec.Command(c.bin, args...)
	cmd.Env, cmd.Stdin = c.env, stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

func (c *dockerCLI) workflow(name, image, checkout, scripts string, payloads []string, outputs string) (err error) {
	vols := []string{name + "-work", name + "-steps", name + "-outputs"}
	defer func() {
		_, e1 := c.run(nil, "rm", "-f", "-v", name)
		_, e2 := c.run(nil, "network", "rm", name)
		_, e3 := c.run(nil, append([]string{"volume", "rm"}, vols...)...)
		if err == nil {
			err = e1
		}
		if err == nil {
			err = e2
		}
		if err == nil {
			err = e3
		}
	}()
	if _, err := c.run(nil, "network", "create", "--driver", "bridge", name); err != nil {
		return err
	}
	for _, v := range vols {
		if _, err := c.run(nil, "volume", "create", v); err != nil {
			return err
		}
	}
	args := []string{"run", "-d", "--name", name, "--init", "--network", name, "--cap-drop", "ALL"}
	for _, c := range DefaultCapabilities {
		args = append(args, "--cap-add", c)
	}
	args = append(args, "--security-opt", "no-new-privileges", "--ipc", "private", "--cgroupns", "private",
		"--log-driver", "none", "--pids-limit", strconv.Itoa(DefaultPidsLimit), "-w", "/work")
	for i, dir := range []string{"work", "steps", "outputs"} {
		args = append(args, "--mount", "type=volume,src="+vols[i]+",dst=/"+dir+",volume-nocopy")
	}
	args = append(args, "--entrypoint", "sh", image, "-c", keepAlive)
	if _, err := c.run(nil, args...); err != nil {
		return err
	}
	if _, err := c.run(nil, "cp", checkout+"/.", name+":/work"); err != nil {
		return err
	}
	if _, err := c.run(nil, "cp", scripts+"/.", name+":/steps"); err != nil {
		return err
	}
	for i, p := range payloads {
		if out, err := c.run(strings.NewReader(p), "exec", "-i", name, "sh", "-c", launcher); err != nil {
			return fmt.Errorf("step %d: %w\n%s", i+1, err, out)
		}
	}
	_, err = c.run(nil, "cp", name+":/outputs/.", outputs)
	return err
}
