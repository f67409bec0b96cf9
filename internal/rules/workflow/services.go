package workflow

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
)

// DefaultServiceTimeout is how long a service may take to become ready
// when its ready: names no timeout.
const DefaultServiceTimeout = 60 * time.Second

// maxServiceName keeps a service's container name ("svc-" and its
// name) a DNS label with room to spare.
const maxServiceName = 40

var serviceName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// Service is one container that runs beside the steps for the whole run
// (services:), reachable from every step at localhost on its ports.
type Service struct {
	Name  string
	Image string
	// Env is the service's environment, in file order: plain values,
	// never a secret.
	Env []EnvVar
	// Ports are the TCP ports it listens on, in file order.
	Ports []int
	// Command, when set, replaces the image's entrypoint and arguments.
	Command []string
	Ready   Probe
	Line    int
}

// Probe is how a service is known to be ready: at most one of TCP,
// HTTPPath or Command; none of them is ready once the service runs.
type Probe struct {
	// TCP is a port that accepts a connection.
	TCP int
	// HTTPPath is a path that answers 2xx or 3xx to a GET on HTTPPort.
	HTTPPath string
	HTTPPort int
	// Command is a sh script, run in the service's container, that exits 0.
	Command string
	// Timeout bounds the wait, from when the service's container started.
	Timeout time.Duration
}

// services reads the services: mapping, name by name in file order.
// secrets are the names the workflow grants: no service may name one.
func (d *decoder) services(n ast.Node, w *Workflow) {
	m, ok := n.(*ast.MappingNode)
	if !ok {
		d.errorAt(n.GetToken(), "services: want a mapping of name: service, got %s", kind(n))
		return
	}
	ports := map[int]string{}
	for _, mv := range m.Values {
		name := mv.Key.GetToken().Value
		what := "services." + name
		if !serviceName.MatchString(name) || len(name) > maxServiceName {
			d.errorAt(mv.Key.GetToken(), "services: %q is not a service name (lower-case letters, digits and -, at most %d)", name, maxServiceName)
		}
		v := deref(mv.Value)
		s := Service{Name: name, Line: tokenOf(v).Position.Line}
		var readyNode ast.Node
		d.mapping(v, what, map[string]func(string, ast.Node){
			"image": func(k string, v ast.Node) { s.Image = d.str(what+".image", v).value },
			"env":   func(k string, v ast.Node) { s.Env = d.serviceEnv(what, v, w.Secrets) },
			"ports": func(k string, v ast.Node) {
				for _, p := range d.strings(what+".ports", v) {
					port := d.port(what+".ports", p)
					if other, dup := ports[port]; dup && port != 0 {
						d.errorAt(p.tk, "%s.ports: port %d is also %s's: services share the run's network, so each port is one service's", what, port, other)
					}
					ports[port] = name
					s.Ports = append(s.Ports, port)
				}
			},
			"command": func(k string, v ast.Node) {
				for _, a := range d.strings(what+".command", v) {
					s.Command = append(s.Command, a.value)
				}
			},
			"ready": func(k string, v ast.Node) { readyNode = v },
			"secrets": func(k string, v ast.Node) {
				d.errorAt(v.GetToken(), "%s.secrets: a service never receives secrets: they travel only on a step's stdin", what)
			},
		}, "image")
		if readyNode != nil {
			s.Ready = d.probe(what+".ready", readyNode, s.Ports)
		}
		if s.Ready.TCP == 0 && s.Ready.HTTPPath == "" && s.Ready.Command == "" && len(s.Ports) > 0 {
			// No way named: the first port accepts a connection.
			s.Ready.TCP = s.Ports[0]
		}
		if s.Ready.Timeout == 0 {
			s.Ready.Timeout = DefaultServiceTimeout
		}
		w.Services = append(w.Services, s)
	}
}

// serviceEnv reads a service's env: plain values only. A variable named
// as a granted secret, or a value that reads one ($NAME, ${NAME}) or an
// expression (${{ … }}), is refused: a service's environment is in its
// container's spec, where a secret must never be.
func (d *decoder) serviceEnv(what string, n ast.Node, secrets []string) []EnvVar {
	m, ok := n.(*ast.MappingNode)
	if !ok {
		d.errorAt(n.GetToken(), "%s.env: want a mapping of NAME: value, got %s", what, kind(n))
		return nil
	}
	var out []EnvVar
	for _, mv := range m.Values {
		name := mv.Key.GetToken().Value
		if !shellName.MatchString(name) || strings.HasPrefix(name, "KNOTLESS_") {
			d.errorAt(mv.Key.GetToken(), "%s.env: %q is not a usable variable name (letters, digits, _; KNOTLESS_ is reserved)", what, name)
		}
		val := d.str(what+".env."+name, deref(mv.Value))
		if slices.Contains(secrets, name) {
			d.errorAt(mv.Key.GetToken(), "%s.env: %q is a secret the workflow grants: a service never receives secrets (they travel only on a step's stdin)", what, name)
		}
		if s := secretIn(val.value, secrets); s != "" {
			d.errorAt(val.tk, "%s.env.%s: names the secret %s: a service never receives secrets (they travel only on a step's stdin), and its env is taken as written", what, name, s)
		} else if strings.Contains(val.value, "${{") {
			d.errorAt(val.tk, "%s.env.%s: a service's env is taken as written: no ${{ … }} expressions, and never a secret", what, name)
		}
		out = append(out, EnvVar{name, val.value})
	}
	return out
}

// secretIn returns the first of secrets that value reads as $NAME or
// ${NAME}, or "".
func secretIn(value string, secrets []string) string {
	for _, s := range secrets {
		if strings.Contains(value, "${"+s+"}") {
			return s
		}
		for rest := value; ; {
			i := strings.Index(rest, "$"+s)
			if i < 0 {
				break
			}
			after := rest[i+1+len(s):]
			if after == "" || !isNameByte(after[0]) {
				return s
			}
			rest = after
		}
	}
	return ""
}

func isNameByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// probe reads a service's ready: one of tcp, http or command, and a
// timeout. http is a path, on http-port (default: the service's first
// port).
func (d *decoder) probe(what string, n ast.Node, ports []int) Probe {
	var p Probe
	var kinds []string
	var httpTk *token.Token
	d.mapping(n, what, map[string]func(string, ast.Node){
		"tcp": func(k string, v ast.Node) {
			kinds = append(kinds, k)
			p.TCP = d.port(what+".tcp", d.str(what+".tcp", v))
		},
		"http": func(k string, v ast.Node) {
			kinds = append(kinds, k)
			s := d.str(what+".http", v)
			httpTk = s.tk
			if !strings.HasPrefix(s.value, "/") {
				d.errorAt(s.tk, "%s.http: want a path starting with /, got %q", what, s.value)
			}
			p.HTTPPath = s.value
		},
		"http-port": func(k string, v ast.Node) { p.HTTPPort = d.port(what+".http-port", d.str(what+".http-port", v)) },
		"command": func(k string, v ast.Node) {
			kinds = append(kinds, k)
			p.Command = d.str(what+".command", v).value
		},
		"timeout": func(k string, v ast.Node) { p.Timeout = d.duration(what+".timeout", v) },
	})
	if len(kinds) > 1 {
		d.errorAt(tokenOf(n), "%s: %s exclude each other: want one way to tell the service is ready", what, strings.Join(kinds, " and "))
	}
	switch {
	case p.HTTPPath != "" && p.HTTPPort == 0 && len(ports) == 0:
		d.errorAt(httpTk, "%s.http: the service has no ports: name one in ports or http-port", what)
	case p.HTTPPath != "" && p.HTTPPort == 0:
		p.HTTPPort = ports[0]
	case p.HTTPPath == "" && p.HTTPPort != 0:
		d.errorAt(tokenOf(n), "%s.http-port: only with http", what)
	}
	return p
}

// port reads a TCP port number.
func (d *decoder) port(what string, s scalar) int {
	n, err := strconv.Atoi(s.value)
	if err != nil || n < 1 || n > 65535 {
		d.errorAt(s.tk, "%s: want a port from 1 to 65535, got %q", what, s.value)
		return 0
	}
	return n
}

// ServiceImages are the images the workflow's services name, in file
// order.
func (w *Workflow) ServiceImages() []string {
	out := make([]string, len(w.Services))
	for i, s := range w.Services {
		out[i] = s.Image
	}
	return out
}

// StepImages are the images the workflow's steps name for themselves,
// in step order.
func (w *Workflow) StepImages() []string {
	var out []string
	for _, s := range w.Steps {
		if s.Image != "" {
			out = append(out, s.Image)
		}
	}
	return out
}

// String says how the probe tells the service is ready, for a log line.
func (p Probe) String() string {
	switch {
	case p.TCP != 0:
		return fmt.Sprintf("tcp port %d", p.TCP)
	case p.HTTPPath != "":
		return fmt.Sprintf("http GET :%d%s", p.HTTPPort, p.HTTPPath)
	case p.Command != "":
		return "command " + strconv.Quote(p.Command)
	}
	return "running"
}
