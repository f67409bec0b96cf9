// Package browser_test drives Debian's chromium, headless over the
// DevTools protocol (chromedp), against the page that follows a check's
// output (/runs/DID/KEY): a line a step prints shows on the page before
// the step ends. Install chromium with tests/browser/install.
package browser_test

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/device"

	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/executor/shell"
	"knotless.dev/run/internal/output"
	"knotless.dev/run/internal/output/outputhttp"
	"knotless.dev/run/internal/parts/live"
	"knotless.dev/run/internal/rules/job"
	"knotless.dev/run/internal/rules/workflow"
)

const (
	did = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
	key = "zsvmur6bdrvdcvafwfoo7mmwp4"
)

// browser starts headless chromium with a fresh profile that reaches nothing but loopback: no proxy but a closed port for any
// other host, no name resolved.
func browser(t *testing.T) context.Context {
	t.Helper()
	if testing.Short() {
		t.Skip("browser test: skipped under -short (it starts chromium)")
	}
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed: run tests/browser/install (as root)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox, // the tests run as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("no-pings", true),
		chromedp.Flag("proxy-server", "http://127.0.0.1:9"),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	tctx, cancelT := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelT)
	return tctx
}

// waitFor polls until the JavaScript expression is true.
func waitFor(ctx context.Context, expr string) error {
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(20*time.Millisecond)))
	return err
}

// eval evaluates a JavaScript expression.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// A line a step prints shows on the page, coloured, timed and under its
// step, while the step is still running; when the run ends the page says
// so. The screenshots are kept as the test's artifacts (go test
// -artifacts keeps them under -outputdir).
func TestPageFollowsTheRunLive(t *testing.T) {
	ctx := browser(t)
	hub := output.NewHub(output.HubConfig{})
	check := "at://" + did + "/dev.knotless.check/" + key
	s, err := hub.Open(check, "r1")
	if err != nil {
		t.Fatal(err)
	}
	h, err := outputhttp.New(outputhttp.Config{Source: hub})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	_, _ = s.Write([]byte("knotless-run: workflow ci, run r1, executor shell\n"))
	s.StepStarted(1, "build")
	_, _ = s.Write([]byte("==> step 1/2: build\n"))
	_, _ = s.Write([]byte("compiling \x1b[1;32mline printed by the step\x1b[0m\n"))

	// A phone: Pixel 5's screen, touch and mobile viewport.
	if err := chromedp.Do(ctx, chromedp.Emulate(device.Pixel5), chromedp.Navigate(srv.URL+"/runs/"+did+"/"+key)); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, `document.getElementById("log").innerText.includes("line printed by the step")`); err != nil {
		t.Fatalf("the line did not show: %v", err)
	}
	// It showed while the step went on: nothing ended it yet.
	if final, _ := s.Final(); final {
		t.Fatal("the stream ended before the line showed")
	}
	stepStatus := eval[string](t, ctx, `document.querySelector("details.step summary .st").textContent`)
	stepName := eval[string](t, ctx, `document.querySelector("details.step summary .name").textContent`)
	lineClass := eval[string](t, ctx, `document.querySelector("details.step .line:last-child .tx span").className`)
	ts := eval[string](t, ctx, `document.querySelector("details.step .line:last-child .ts").textContent`)
	if stepStatus != "running" || stepName != "build" || lineClass != "b f2" || !regexp.MustCompile(`^\d\d:\d\d:\d\d$`).MatchString(ts) {
		t.Errorf("step %q %q, line class %q, time %q; want build running, bold green, HH:MM:SS", stepName, stepStatus, lineClass, ts)
	}
	// On the phone's width the page does not scroll sideways.
	if w, vw := eval[int](t, ctx, `document.documentElement.scrollWidth`), eval[int](t, ctx, `window.innerWidth`); w > vw {
		t.Errorf("the page is %dpx wide on a %dpx screen", w, vw)
	}
	screenshot(t, ctx, "live.png")

	s.StepEnded(1, run.Success)
	_, _ = s.Write([]byte("<== step build: success, exit 0, 1.2s\n"))
	s.StepStarted(2, "test")
	_, _ = s.Write([]byte("==> step 2/2: test\nFAIL: TestSomething\n"))
	s.StepEnded(2, run.Failure)
	_, _ = s.Write([]byte("<== step test: failure, exit 1, 0.3s\n"))
	s.End(string(run.Failure))
	if err := waitFor(ctx, `document.body.dataset.state === "failure" && document.querySelector("details.step[data-status=success]") !== null && document.querySelector("details.step[data-status=failure]") !== null`); err != nil {
		t.Fatalf("the end did not show: %v", err)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("details.step").length`); n != 2 {
		t.Errorf("%d step sections, want 2", n)
	}
	screenshot(t, ctx, "ended.png")
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	p := filepath.Join(t.ArtifactDir(), name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// The page on a runner's own listener (serve --listen: the live-output
// part), following a real run on the shell executor: the line its step
// prints shows while the step waits for a file the test makes only
// after, and the run's end shows when the part ends the stream.
func TestPageOnTheRunnersListener(t *testing.T) {
	ctx := browser(t)
	l := live.New(live.Config{Listen: "127.0.0.1:0"}, did, filepath.Join(t.TempDir(), "files"), live.Ports{}, nil)
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	stop := l.Serve()
	defer stop()
	j := &job.Job{Key: key}
	w := l.Open(j, "r1", nil, nil)
	gate := filepath.Join(t.TempDir(), "go")
	eng := run.New(run.Config{Executor: shell.New(shell.Config{Root: t.TempDir(), Path: os.Getenv("PATH")})})
	done := make(chan *run.Result, 1)
	go func() {
		done <- eng.Run(context.Background(), run.Request{
			RunID: "r1",
			Workflow: &workflow.Workflow{Name: "ci", Steps: []workflow.Step{
				{Name: "build", Run: `printf 'compiling \033[1;32mline printed by the step\033[0m\n'; while [ ! -e ` + gate + ` ]; do sleep 0.05; done`},
				{Name: "test", Run: "echo tested"},
			}},
			Checkout: t.TempDir(),
			Live:     w,
		})
	}()
	if err := chromedp.Do(ctx, chromedp.Emulate(device.Pixel5), chromedp.Navigate("http://"+l.Addr().String()+"/runs/"+did+"/"+key)); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, `document.getElementById("log").innerText.includes("line printed by the step")`); err != nil {
		t.Fatalf("the line did not show: %v", err)
	}
	select {
	case res := <-done:
		t.Fatalf("the run ended (%s) before the test let its step go on", res.Status)
	default:
	}
	if got := eval[string](t, ctx, `document.querySelector("details.step summary .name").textContent`); got != "build" {
		t.Errorf("the step shown: %q, want build", got)
	}
	screenshot(t, ctx, "runner-live.png")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res := <-done
	l.Ended(j, "r1", res, t.TempDir())
	if err := waitFor(ctx, `document.body.dataset.state === "success" && document.querySelectorAll("details.step[data-status=success]").length === 2`); err != nil {
		t.Fatalf("the end did not show: %v", err)
	}
	screenshot(t, ctx, "runner-ended.png")
}

// A run its runner lost, run again under the same check, replaces it on
// the page, which says so: the new run's output from its start, with a
// note naming both runs.
func TestPageShowsTheNewRunOfTheCheck(t *testing.T) {
	ctx := browser(t)
	hub := output.NewHub(output.HubConfig{})
	check := "at://" + did + "/dev.knotless.check/" + key
	lost, _ := hub.Open(check, "r1")
	h, err := outputhttp.New(outputhttp.Config{Source: hub})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	_, _ = lost.Write([]byte("the lost run's line\n"))
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/runs/"+did+"/"+key)); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, `document.getElementById("log").innerText.includes("the lost run's line")`); err != nil {
		t.Fatalf("the line did not show: %v", err)
	}
	again, _ := hub.Open(check, "r2")
	_, _ = again.Write([]byte("the new run's line\n"))
	again.End("success")
	if err := waitFor(ctx, `document.body.dataset.state === "success"`); err != nil {
		t.Fatalf("the end did not show: %v", err)
	}
	text := eval[string](t, ctx, `document.getElementById("log").innerText`)
	note := eval[string](t, ctx, `(document.querySelector(".line.replaced") || {textContent: ""}).textContent`)
	if strings.Contains(text, "the lost run's line") || !strings.Contains(text, "the new run's line") || !strings.Contains(note, "r2") || !strings.Contains(note, "r1") {
		t.Errorf("after the new run: note %q, log %q", note, text)
	}
	screenshot(t, ctx, "replaced.png")
}
