// Package guide runs the operator's guides as written: the commands of
// docs/guide/first-hour.md, taken from the page, against a real PDS,
// the test cluster and a git host over https, with only the settings
// the page asks the reader for given by the test.
package guide

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
	"knotless.dev/run/internal/lib/syncbuf"
	"knotless.dev/run/tests/clustertest"
	"knotless.dev/run/tests/gitrepo"
	"knotless.dev/run/tests/pds"
)

func TestMain(m *testing.M) { clustertest.Main(m) }

const firstHour = "../../docs/guide/first-hour.md"

// block is one fenced block of a guide: its info string after the
// language (first-hour, first-hour-serve, …) and its body.
type block struct {
	info, body string
	line       int
	other      bool // a block of another language, skipped
}

// blocks returns the page's fenced blocks of language sh, in order.
func blocks(doc string) []block {
	var out []block
	var cur *block
	var body strings.Builder
	for i, line := range strings.Split(doc, "\n") {
		fence, isFence := strings.CutPrefix(line, "```")
		switch {
		case isFence && cur == nil:
			lang, info, _ := strings.Cut(fence, " ")
			cur = &block{info: info, line: i + 1, other: lang != "sh"}
			body.Reset()
		case isFence && fence == "":
			if !cur.other {
				cur.body = body.String()
				out = append(out, *cur)
			}
			cur = nil
		case cur != nil:
			body.WriteString(line + "\n")
		}
	}
	return out
}

var settingLine = regexp.MustCompile(`(?m)^([A-Z_]+)=`)

// TestFirstHour runs docs/guide/first-hour.md: every `sh first-hour`
// block in order, in one shell environment carried from block to block,
// the `first-hour-serve` block in the background as the reader's second
// terminal, and the `first-hour-kubectl` block when kubectl is here.
// The `first-hour-settings` block is the reader's: the test gives each
// of its variables a value of its own (and fails if the page asks for
// one it does not give). Then the push's check is success with the
// sealed secret masked in its log, the second account's pull ran
// untrusted (no secret) and succeeded, the runner logged no error line,
// and nothing in the walk asked DNS anything.
//
// Every command runs in a mount namespace whose /etc/resolv.conf names
// a nameserver this test counts queries at, and whose CA bundle is the
// git host's test CA (git reads no other), as TestServeMakesNoDNSQuery
// does for the daemon alone.
func TestFirstHour(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: this test walks the first-hour guide on a real PDS and the test cluster")
	}
	if os.Geteuid() != 0 {
		t.Fatal("TestFirstHour needs root: it mounts over /etc/resolv.conf and the CA bundle in a mount namespace, and listens on port 53")
	}
	t.Parallel()
	if err := pds.Installed(); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"bash", "curl", "jq", "git", "unshare", "mount", "od"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the guide's walk needs %s: %v", tool, err)
		}
	}
	page, err := os.ReadFile(firstHour)
	if err != nil {
		t.Fatal(err)
	}
	steps := blocks(string(page))

	c := clustertest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	queries := dnsTrap(t)

	srv, err := pds.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	// The reader's own accounts: the repository's owner, and a second
	// account for the pull. The walk makes the runner's.
	owner, err := srv.CreateAccount(ctx, "owner")
	if err != nil {
		t.Fatal(err)
	}
	contrib, err := srv.CreateAccount(ctx, "contrib")
	if err != nil {
		t.Fatal(err)
	}

	// The git host: two empty repositories over https, the owner's and
	// the second account's fork.
	gitRoot := t.TempDir()
	for _, repo := range []string{"hello.git", "fork.git"} {
		if out, err := exec.Command("git", "init", "--quiet", "--bare", "--initial-branch=main", filepath.Join(gitRoot, repo)).CombinedOutput(); err != nil {
			t.Fatalf("git init %s: %v\n%s", repo, err, out)
		}
	}
	host, ca := gitrepo.ServeTLS(t, "", gitRoot)

	dir := t.TempDir()  // the reader's $DIR
	work := t.TempDir() // where the reader types
	home := t.TempDir()
	writeFile(t, filepath.Join(dir, "owner-password"), owner.Password+"\n")
	writeFile(t, filepath.Join(dir, "contrib-password"), contrib.Password+"\n")
	// The reader's git: who commits, and the git host's credentials.
	writeFile(t, filepath.Join(home, ".gitconfig"), fmt.Sprintf("[user]\n\tname = Operator\n\temail = operator@example.com\n"+
		"[credential]\n\thelper = \"!f() { echo username=%s; echo password=%s; }; f\"\n", host.User, host.Password))
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	writeFile(t, caFile, string(ca))

	settings := map[string]string{
		"PDS":                srv.URL,
		"PLC":                srv.PLCURL,
		"PDS_ADMIN_PASSWORD": srv.AdminPassword,
		"RUNNER_HANDLE":      "knotless-ci.test",
		"RUNNER_EMAIL":       "knotless-ci@example.com",
		"OWNER_DID":          owner.DID.String(),
		"OWNER_PDS":          srv.URL,
		"CONTRIB_DID":        contrib.DID.String(),
		"CONTRIB_PDS":        srv.URL,
		"SOURCE":             host.URL + "/hello.git",
		"FORK":               host.URL + "/fork.git",
		"ADMIN_KUBECONFIG":   c.Kubeconfig,
		"NAMESPACE":          c.Namespace,
		"IMAGE":              c.Image,
		"DIR":                dir,
		"LISTEN":             freeAddr(t),
	}
	var asked []string
	for _, b := range steps {
		if b.info == "first-hour-settings" {
			for _, m := range settingLine.FindAllStringSubmatch(b.body, -1) {
				asked = append(asked, m[1])
			}
		}
	}
	var given []string
	for k := range settings {
		given = append(given, k)
	}
	slices.Sort(asked)
	slices.Sort(given)
	if !slices.Equal(asked, given) {
		t.Fatalf("the guide's settings are %v; the test gives %v", asked, given)
	}

	bin := filepath.Dir(buildBinary(t))
	w := &walk{t: t, work: work, envFile: filepath.Join(t.TempDir(), "env.sh"), resolv: queries.resolvConf, ca: caFile,
		env: append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "HOME="+home, "GODEBUG=netdns=go", "KUBECONFIG=")}
	var exports strings.Builder
	for _, k := range given {
		fmt.Fprintf(&exports, "export %s=%s\n", k, shellQuote(settings[k]))
	}
	writeFile(t, w.envFile, exports.String())

	// The walk. The runner runs from its block to the end of the test;
	// the blocks after it stop if it exits.
	walkCtx, stopWalk := context.WithCancel(ctx)
	defer stopWalk()
	var serve *exec.Cmd
	serveLog := &syncbuf.Buffer{}
	served := make(chan error, 1)
	var shown strings.Builder // what the guide's commands printed
	for _, b := range steps {
		switch b.info {
		case "first-hour-settings":
			continue
		case "first-hour-kubectl":
			if _, err := exec.LookPath("kubectl"); err != nil {
				t.Logf("NOT RUN: the guide's kubectl block (line %d): no kubectl on PATH", b.line)
				continue
			}
			out := w.run(walkCtx, b, serveLog)
			if n := strings.Count(out, "yes\n"); n != 2 {
				t.Errorf("the guide's can-i answers (line %d): %q, want yes twice", b.line, out)
			}
		case "first-hour-serve":
			if serve != nil {
				t.Fatalf("the guide starts the runner twice (line %d)", b.line)
			}
			body, ok := strings.CutPrefix(b.body, "knotless-run serve ")
			if !ok {
				t.Fatalf("the guide's runner block (line %d) is not one `knotless-run serve` command:\n%s", b.line, b.body)
			}
			serve = w.command(walkCtx, "exec knotless-run serve "+body)
			serve.Stdout, serve.Stderr = serveLog, serveLog
			if err := serve.Start(); err != nil {
				t.Fatal(err)
			}
			go func() {
				served <- serve.Wait()
				stopWalk()
			}()
		case "first-hour":
			shown.WriteString(w.run(walkCtx, b, serveLog))
		default:
			t.Fatalf("the guide has an sh block of unknown kind %q at line %d", b.info, b.line)
		}
	}
	if serve == nil {
		t.Fatal("the guide never starts the runner")
	}
	// The reader stops the runner.
	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("the runner ended with %v after SIGTERM\n%s", err, serveLog.String())
		}
	case <-time.After(2 * time.Minute):
		_ = serve.Process.Kill()
		<-served
		t.Fatalf("the runner did not stop within 2 minutes of SIGTERM\n%s", serveLog.String())
	}
	log := serveLog.String()

	// What the walk did, read from the records and the cluster.
	runner := syntax.DID(strings.TrimSpace(readFile(t, filepath.Join(dir, "did"))))
	token := strings.TrimSpace(readFile(t, filepath.Join(dir, "deploy-token")))
	commit := gitHead(t, filepath.Join(work, "hello"))
	pullCommit := gitHead(t, filepath.Join(work, "contrib"))
	cat, err := pdsclient.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	reader := &pdsclient.Reader{Dir: srv.Directory(), Catalog: cat}
	checks, bad, err := pdsclient.List[forge.Check](ctx, reader, runner, forge.CollectionCheck)
	if err != nil || len(bad) > 0 {
		t.Fatalf("the runner's checks: %v %v", err, bad)
	}
	find := func(kind, commit string) *forge.Check {
		for _, r := range checks {
			if r.Value.Subject.Kind == kind && r.Value.Subject.Commit == commit {
				return &r.Value
			}
		}
		t.Fatalf("no %s check for %s among %d checks\n%s", kind, commit, len(checks), log)
		return nil
	}
	blob := func(ch *forge.Check) string {
		if ch.Log == nil {
			t.Fatalf("the %s check has no log", ch.Subject.Kind)
		}
		b, err := reader.GetBlob(ctx, runner, ch.Log.Ref.String())
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	push := find(forge.KindPush, commit)
	if push.Status != "success" {
		t.Errorf("the push's check: %s (%s)\n%s", push.Status, push.Error, log)
	}
	if l := blob(push); !strings.Contains(l, "deploying with ***") || strings.Contains(l, token) {
		t.Errorf("the push's log does not mask the sealed secret:\n%s", l)
	}
	pull := find(forge.KindPull, pullCommit)
	if pull.Status != "success" {
		t.Errorf("the pull's check: %s (%s)\n%s", pull.Status, pull.Error, log)
	}
	if l := blob(pull); !strings.Contains(l, "secret DEPLOY_TOKEN withheld: untrusted run") || !strings.Contains(l, "no token: an untrusted run") {
		t.Errorf("the pull's log does not show an untrusted run:\n%s", l)
	}
	// The running check said where its live output was read: the
	// runner's listener, which `knotless-run logs` read it from.
	if push.Live == nil || push.Live.Service != "http://"+settings["LISTEN"] || push.Live.Page != push.Live.Service+"/runs/"+runner.String()+"/"+forge.CheckKey(push.Subject, push.Workflow) {
		t.Errorf("the push's check says its live output is at %+v, want the runner's listener %s", push.Live, settings["LISTEN"])
	}
	// The guide's own commands showed the reader the same: the blob,
	// and `knotless-run logs`.
	all := shown.String()
	if n := strings.Count(all, "deploying with ***"); n < 2 {
		t.Errorf("the guide's commands showed the push's log %d times, want the blob's and knotless-run logs'", n)
	}
	for _, want := range []string{"deploying with ***", "no token: an untrusted run", `"status": "success"`} {
		if !strings.Contains(all, want) {
			t.Errorf("the guide's commands never showed %q", want)
		}
	}
	if strings.Contains(all, token) {
		t.Errorf("the guide's commands printed the secret's value")
	}

	// A clean walk logs no error, and asks DNS nothing.
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=error") {
			t.Errorf("the runner logged an error line in a clean walk: %s", line)
		}
	}
	if !strings.Contains(log, "made a sealing key pair") {
		t.Errorf("the runner did not log its new sealing key:\n%s", log)
	}
	if n := queries.count.Load(); n != 0 {
		t.Errorf("the walk sent %d DNS queries, want none\n%s", n, log)
	}
	jobs, err := c.Clientset.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(jobs.Items) != 0 {
		t.Errorf("left in %s: %v %v", c.Namespace, jobs, err)
	}
}

// TestRunLogsNoError: `knotless-run run` of the example workflow on the
// cluster, as README.md shows it, logs no error line, with its outputs
// brought back or without. client-go used to log the last exec stream's
// closing as "Unhandled Error … use of closed network connection" at
// level error, three lines a run, when no transfer of outputs came after
// the last step.
func TestRunLogsNoError(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED UNDER -short: this test runs a workflow on the test cluster")
	}
	t.Parallel()
	c := clustertest.Start(t)
	bin := buildBinary(t)
	for _, outputs := range []bool{false, true} {
		t.Run(fmt.Sprintf("outputs=%v", outputs), func(t *testing.T) {
			dir := t.TempDir()
			args := []string{"--log-format", "json", "run", "--executor", "kubernetes",
				"--kubeconfig", c.Kubeconfig, "--namespace", c.Namespace, "--image", c.Image,
				"--workflow", "../../examples/hello/.knotless/workflows/build.yaml", "--workdir", "../../examples/hello",
				"--result", filepath.Join(dir, "result.json")}
			if outputs {
				args = append(args, "--outputs", filepath.Join(dir, "out"))
			}
			cmd := exec.CommandContext(t.Context(), bin, args...)
			cmd.Env = append(os.Environ(), "KUBECONFIG=")
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("run: %v\n%s%s", err, stdout.String(), stderr.String())
			}
			lines := 0
			for line := range strings.Lines(stderr.String()) {
				var entry struct {
					Level string `json:"level"`
				}
				if err := json.Unmarshal([]byte(line), &entry); err != nil {
					t.Fatalf("a log line that is not JSON: %q", line)
				}
				lines++
				if entry.Level == "error" {
					t.Errorf("a clean run logged an error line: %s", line)
				}
			}
			if lines == 0 || !strings.Contains(stdout.String(), "knotless-run: workflow build: success") {
				t.Errorf("the run logged %d lines and said:\n%s", lines, stdout.String())
			}
		})
	}
}

// buildBinary builds knotless-run from this checkout into a directory
// of the test's and returns its path.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "knotless-run")
	if out, err := exec.Command("go", "build", "-o", bin, "knotless.dev/run/cmd/knotless-run").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// walk runs a guide's blocks as the reader would in one shell: each
// block in bash with the variables the earlier ones set (kept in
// envFile), in cwd work, in a mount namespace of its own with the test's
// resolv.conf and CA bundle.
type walk struct {
	t       *testing.T
	work    string
	envFile string
	resolv  string
	ca      string
	env     []string
}

// command returns the command that runs script after loading the
// walk's variables.
func (w *walk) command(ctx context.Context, script string) *exec.Cmd {
	w.t.Helper()
	f, err := os.CreateTemp(w.t.TempDir(), "block-*.sh")
	if err != nil {
		w.t.Fatal(err)
	}
	fmt.Fprintf(f, "set -euo pipefail\nset -a\n. %s\n%s", shellQuote(w.envFile), script)
	if err := f.Close(); err != nil {
		w.t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/ssl/certs/ca-certificates.crt && exec bash "$3"`,
		"sh", w.resolv, w.ca, f.Name())
	cmd.Dir = w.work
	cmd.Env = w.env
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// run runs one block to its end and returns its output; a block that
// fails fails the test, with the runner's log so far.
func (w *walk) run(ctx context.Context, b block, serveLog *syncbuf.Buffer) string {
	w.t.Helper()
	cmd := w.command(ctx, b.body+"export -p > "+shellQuote(w.envFile)+"\n")
	began := time.Now()
	out, err := cmd.CombinedOutput()
	w.t.Logf("the guide's block at line %d (%s):\n%s%s", b.line, time.Since(began).Round(time.Millisecond), b.body, indent(string(out)))
	if err != nil {
		w.t.Fatalf("the guide's block at line %d failed: %v\n%s\nthe runner's log:\n%s", b.line, err, out, serveLog.String())
	}
	return string(out)
}

// dns is a nameserver on a loopback address of its own that counts
// what reaches it, and a resolv.conf naming it.
type dns struct {
	resolvConf string
	count      atomic.Int64
}

func dnsTrap(t *testing.T) *dns {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	ip := net.IPv4(127, b[0]|1, b[1], b[2]|1)
	d := &dns{resolvConf: filepath.Join(t.TempDir(), "resolv.conf")}
	writeFile(t, d.resolvConf, fmt.Sprintf("nameserver %s\noptions timeout:1 attempts:1\n", ip))
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: 53})
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: 53})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 4096)
		for {
			if _, _, err := udp.ReadFrom(buf); err != nil {
				return
			}
			d.count.Add(1)
		}
	}()
	go func() {
		defer wg.Done()
		for {
			conn, err := tcp.Accept()
			if err != nil {
				return
			}
			d.count.Add(1)
			conn.Close()
		}
	}()
	t.Cleanup(func() {
		udp.Close()
		tcp.Close()
		wg.Wait()
	})
	return d
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func indent(s string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b.WriteString("  > " + sc.Text() + "\n")
	}
	return b.String()
}

func gitHead(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse in %s: %v", dir, err)
	}
	return strings.TrimSpace(string(out))
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// freeAddr is a loopback address nothing listens on now: the reader's
// LISTEN.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
