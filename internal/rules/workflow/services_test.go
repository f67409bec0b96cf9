package workflow

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseServices(t *testing.T) {
	t.Parallel()
	src := `on: push
secrets: [TOKEN]
services:
  db:
    image: postgres:16
    env: {POSTGRES_PASSWORD: test, PORT: 5432}
    ports: [5432]
  web:
    image: nginx
    ports: [8080, 8443]
    command: [nginx, -g, daemon off;]
    ready: {http: /healthz, timeout: 30s}
  late:
    image: redis
    ports: [6379]
    ready: {timeout: 2m}
  check:
    image: busybox
    ready: {command: test -e /tmp/ready}
  bare:
    image: busybox
    command: sleep 1000
steps:
  - run: psql
`
	got, err := Parse("ci.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []Service{
		{Name: "db", Image: "postgres:16", Env: []EnvVar{{"POSTGRES_PASSWORD", "test"}, {"PORT", "5432"}}, Ports: []int{5432},
			Ready: Probe{TCP: 5432, Timeout: DefaultServiceTimeout}, Line: 5},
		{Name: "web", Image: "nginx", Ports: []int{8080, 8443}, Command: []string{"nginx", "-g", "daemon off;"},
			Ready: Probe{HTTPPath: "/healthz", HTTPPort: 8080, Timeout: 30 * time.Second}, Line: 9},
		{Name: "late", Image: "redis", Ports: []int{6379}, Ready: Probe{TCP: 6379, Timeout: 2 * time.Minute}, Line: 14},
		{Name: "check", Image: "busybox", Ready: Probe{Command: "test -e /tmp/ready", Timeout: DefaultServiceTimeout}, Line: 18},
		{Name: "bare", Image: "busybox", Command: []string{"sleep 1000"}, Ready: Probe{Timeout: DefaultServiceTimeout}, Line: 21},
	}
	if diff := cmp.Diff(want, got.Services); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
}

func TestParseServicesErrors(t *testing.T) {
	t.Parallel()
	head := "on: push\nsecrets: [TOKEN]\nsteps:\n  - run: x\nservices:\n"
	tests := []struct {
		name, src string
		want      []string
	}{
		{"secret as env name", "  db:\n    image: x\n    env: {TOKEN: a}\n", []string{
			`w.yaml:8:11: services.db.env: "TOKEN" is a secret the workflow grants: a service never receives secrets (they travel only on a step's stdin)`,
		}},
		{"secret in env value", "  db:\n    image: x\n    env: {A: \"pre-${TOKEN}\", B: $TOKEN}\n", []string{
			`w.yaml:8:14: services.db.env.A: names the secret TOKEN: a service never receives secrets (they travel only on a step's stdin), and its env is taken as written`,
			`w.yaml:8:33: services.db.env.B: names the secret TOKEN: a service never receives secrets (they travel only on a step's stdin), and its env is taken as written`,
		}},
		{"expression in env", "  db:\n    image: x\n    env: {A: \"${{ secrets.TOKEN }}\"}\n", []string{
			`w.yaml:8:14: services.db.env.A: a service's env is taken as written: no ${{ … }} expressions, and never a secret`,
		}},
		{"secrets field", "  db:\n    image: x\n    secrets: [TOKEN]\n", []string{
			`w.yaml:8:14: services.db.secrets: a service never receives secrets: they travel only on a step's stdin`,
		}},
		{"bad name and no image", "  DB_1:\n    ports: [1]\n", []string{
			`w.yaml:6:3: services: "DB_1" is not a service name (lower-case letters, digits and -, at most 40)`,
			`w.yaml:7:5: services.DB_1: missing field "image"`,
		}},
		{"port taken twice and out of range", "  a:\n    image: x\n    ports: [80]\n  b:\n    image: x\n    ports: [80, 70000]\n", []string{
			`w.yaml:11:13: services.b.ports: port 80 is also a's: services share the run's network, so each port is one service's`,
			`w.yaml:11:17: services.b.ports: want a port from 1 to 65535, got "70000"`,
		}},
		{"two probes", "  a:\n    image: x\n    ready: {tcp: 1, command: true}\n", []string{
			`w.yaml:8:13: services.a.ready: tcp and command exclude each other: want one way to tell the service is ready`,
		}},
		{"http without a port", "  a:\n    image: x\n    ready: {http: /x}\n", []string{
			`w.yaml:8:19: services.a.ready.http: the service has no ports: name one in ports or http-port`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("w.yaml", []byte(head+tt.src))
			if err == nil {
				t.Fatal("parsed")
			}
			got := strings.Split(err.Error(), "\n")
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

// The services example of docs/reference/workflow.md is a valid
// services: field, read as the page says.
func TestReferenceServicesExampleParses(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../../docs/reference/workflow.md")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("docs are left out of this source (the Nix package's)")
	}
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Services\n\n```yaml\n")
	if !ok {
		t.Fatal("docs/reference/workflow.md has no services example")
	}
	src, _, _ := strings.Cut(section, "```")
	w, err := Parse("example.yaml", []byte("on: push\nsteps: [{run: x}]\n"+src))
	if err != nil {
		t.Fatalf("the services example: %v", err)
	}
	got := map[string]Probe{}
	for _, s := range w.Services {
		got[s.Name] = s.Ready
	}
	want := map[string]Probe{
		"db":   {TCP: 5432, Timeout: DefaultServiceTimeout},
		"web":  {HTTPPath: "/healthz", HTTPPort: 8080, Timeout: 2 * time.Minute},
		"seed": {Command: "test -e /tmp/up", Timeout: DefaultServiceTimeout},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("probes (-want +got):\n%s", diff)
	}
}

// A step may name an image of its own; StepImages lists them in step
// order.
func TestParseStepImage(t *testing.T) {
	t.Parallel()
	w, err := Parse("ci.yaml", []byte("on: push\nsteps:\n  - run: a\n  - {run: b, image: golang:1.26}\n  - {run: c, image: node:22}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"", "golang:1.26", "node:22"}, []string{w.Steps[0].Image, w.Steps[1].Image, w.Steps[2].Image}); diff != "" {
		t.Errorf("step images (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"golang:1.26", "node:22"}, w.StepImages()); diff != "" {
		t.Errorf("StepImages (-want +got):\n%s", diff)
	}
}
